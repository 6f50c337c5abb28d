"""Model switches wait on conditions, never on a timer: a CPU-tier switch goes straight from
the victim's offload to the onload; a stopped victim's VRAM is waited for only until the
driver (NVML) shows it back. ``reclaim_sleep_s`` is set far above the test deadlines, so a
fixed sleep anywhere on these paths fails them; only a stopped victim without NVML waits it
(there it is short, and waited out)."""

from __future__ import annotations

import asyncio

import pytest

from model_boss.slots.slot import SlotState

from .fakes import manifest
from .gated import gated_coordinator, steps
from .test_races import acquire, assert_no_overlap

S = SlotState
LONG_RECLAIM_S = 30.0
SWITCH_DEADLINE_S = 3.0  # generous for a loaded CI box; a timer on the path takes 30 s


class DriverMemory:
    """An NVML probe whose free memory the test sets (the driver's view of one GPU)."""

    def __init__(self, free_mb: int) -> None:
        self.free = free_mb
        self.reads = 0

    def free_mb(self, index: int) -> int:
        self.reads += 1
        return self.free

    def process_used_mb(self, index: int, pids: set[int]) -> int | None:
        return None


@pytest.fixture
async def parked_pair(tmp_path):
    """Two 3000 MB models on a 4096 MB GPU, both parkable in CPU RAM."""
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p"), manifest("q")],
                                          offloadable={"p", "q"},
                                          reclaim_sleep_s=LONG_RECLAIM_S)
    await coord.start()
    yield coord, gates, log
    await coord.stop()


async def test_cpu_tier_switches_wait_on_no_timer(parked_pair):
    coord, _gates, log = parked_pair
    (await acquire(coord, "p")).release()
    (await asyncio.wait_for(acquire(coord, "q"), SWITCH_DEADLINE_S)).release()
    for model, other in (("p", "q"), ("q", "p"), ("p", "q")):
        ticket = await asyncio.wait_for(acquire(coord, model), SWITCH_DEADLINE_S)
        assert coord.pool.slots[other].state == S.OFFLOADED
        assert coord.pool.slots[other].lease is None
        ticket.release()
        await assert_no_overlap(coord)
    assert steps(log, "start", "p") == 1 and steps(log, "start", "q") == 1
    assert steps(log, "onload", "p") == 2 and steps(log, "onload", "q") == 1


async def test_stopped_victim_is_waited_for_until_the_driver_shows_its_vram(tmp_path):
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p"), manifest("q")],
                                          reclaim_sleep_s=LONG_RECLAIM_S)
    driver = DriverMemory(free_mb=4096)
    coord.boss.nvml = driver
    await coord.start()
    try:
        (await acquire(coord, "p")).release()
        driver.free = 4096 - 3000  # p's weights are on the GPU
        for_q = asyncio.create_task(acquire(coord, "q"))
        await asyncio.wait_for(_until(lambda: coord.pool.slots["p"].state == S.IDLE), 2)
        reads = driver.reads
        await asyncio.wait_for(_until(lambda: driver.reads > reads + 2), 2)
        assert not for_q.done(), "loaded before the driver had the victim's VRAM back"
        assert steps(log, "start", "q") == 0
        driver.free = 4096  # the driver reclaimed p's memory
        ticket = await asyncio.wait_for(for_q, SWITCH_DEADLINE_S)
        assert coord.pool.slots["q"].state == S.READY
        ticket.release()
    finally:
        await coord.stop()


async def test_stopped_victim_without_nvml_still_waits_reclaim_sleep(tmp_path):
    """Without NVML nothing says when the driver has a stopped worker's VRAM back: the load
    waits ``reclaim_sleep_s`` (short here), then goes ahead."""
    reclaim_s = 1.0
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p"), manifest("q")],
                                          reclaim_sleep_s=reclaim_s)
    await coord.start()
    try:
        (await acquire(coord, "p")).release()
        for_q = asyncio.create_task(acquire(coord, "q"))
        await asyncio.wait_for(_until(lambda: coord.pool.slots["p"].state == S.IDLE), 2)
        stopped = asyncio.get_running_loop().time()
        await asyncio.sleep(reclaim_s / 2)
        assert not for_q.done() and steps(log, "start", "q") == 0
        ticket = await asyncio.wait_for(for_q, reclaim_s + SWITCH_DEADLINE_S)
        waited = asyncio.get_running_loop().time() - stopped
        assert coord.pool.slots["q"].state == S.READY and steps(log, "start", "q") == 1
        assert waited >= reclaim_s - 0.05, waited  # the sleep began as p's stop ended
        ticket.release()
    finally:
        await coord.stop()


async def _until(predicate, interval_s: float = 0.01) -> None:
    """Poll a state the coordinator exposes no event for; callers bound it with wait_for."""
    while not predicate():  # noqa: ASYNC110
        await asyncio.sleep(interval_s)


async def test_a_parked_worker_is_onloaded_only_onto_the_gpus_it_sees(tmp_path):
    """A worker sees only the GPUs it was started with (CUDA_VISIBLE_DEVICES): when the lease
    for its onload is on another GPU, it is stopped and the model starts cold there."""
    two_gpus = [{"index": 0, "name": "a", "vram_mb": 4096}, {"index": 1, "name": "b",
                                                              "vram_mb": 4096}]
    coord, _gates, log = gated_coordinator(
        tmp_path, [manifest("p"), manifest("q"), manifest("r")], offloadable={"p", "q"},
        gpus=two_gpus)
    await coord.start()
    try:
        slots = coord.pool.slots
        (await acquire(coord, "p")).release()
        (await acquire(coord, "q")).release()
        assert (slots["p"].worker_gpus, slots["q"].worker_gpus) == ((0,), (1,))
        (await acquire(coord, "r")).release()  # p, the least recently used, is parked
        coord.pool.owners["r"].set_pinned(True)  # r keeps GPU 0: p's next lease is GPU 1
        assert slots["p"].state == S.OFFLOADED and slots["r"].placement.gpus == [0]
        parked = slots["p"].backend
        ticket = await acquire(coord, "p")
        assert slots["p"].placement.gpus == [1] and slots["p"].worker_gpus == (1,)
        assert slots["p"].backend is not parked and not parked.alive
        assert steps(log, "start", "p") == 2 and steps(log, "onload", "p") == 0
        ticket.release()
        await assert_no_overlap(coord)
        (await acquire(coord, "q")).release()  # q, parked from GPU 1, goes back to GPU 1
        assert steps(log, "onload", "q") == 1 and slots["q"].placement.gpus == [1]
    finally:
        await coord.stop()
