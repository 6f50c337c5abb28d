"""Replicas through the real queue and pool, on in-process workers: each copy plans its own
load; a second copy starts on the other GPU while requests wait and every copy is full, never
on a GPU its sibling holds; requests spread over the copies; the metrics count a model once
over its copies; an idle copy goes by its keep-alive and leaves no slot behind."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from model_boss.catalog import Catalog, CatalogDiff
from model_boss.scheduling.planner import Fit
from model_boss.slot_key import slot_key
from model_boss.slots import SlotState
from model_boss.slots.changes import take_catalog_change

from .fakes import coordinator, manifest, started_client

TWO_GPUS = [{"index": 0, "name": "sim", "vram_mb": 2000},
            {"index": 1, "name": "sim", "vram_mb": 2000}]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def held_burst(tmp_path, gpus, n=3, **settings):
    gate = asyncio.Event()
    coord, log = coordinator(tmp_path, [manifest("m", 1000, replicas=2)], gpus=gpus,
                             vram_margin_mb=0, replica_scale_wait_s=0.05,
                             backend_kwargs={"gate": gate}, **settings)
    return coord, log, gate


async def wait_until(condition, timeout_s: float = 15.0) -> None:
    """Wait for ``condition()``, failing after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout_s} s")


async def test_a_second_copy_starts_on_the_other_gpu_while_requests_wait(tmp_path):
    coord, log, gate = await held_burst(tmp_path, TWO_GPUS)
    async with started_client(coord) as client:
        asking = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
                  for _ in range(3)]
        await wait_until(lambda: sum(s.state == "ready" for s in coord.pool.slots.values())
                         == 2)
        leases = {key: set(s.lease.allocations) for key, s in coord.pool.slots.items()}
        assert leases == {"m": {0}, "m#2": {1}}
        assert [e for e in log if e[0] == "start"] == [("start", "m"), ("start", "m")]
        metrics = (await client.get("/metrics")).text
        gate.set()
        answers = await asyncio.gather(*asking)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert {a.headers["x-model-boss-replica"] for a in answers} == {"m", "m#2"}
    running = {s.labels["model"]: s.value for f in text_string_to_metric_families(metrics)
               for s in f.samples if s.name == "model_boss_model_running"}
    limit = {s.labels["model"]: s.value for f in text_string_to_metric_families(metrics)
             for s in f.samples if s.name == "model_boss_model_max_concurrency"}
    assert running == {"m": 2.0} and limit == {"m": 2.0}  # one model, two copies
    gateway = {s.labels["model_name"] for f in text_string_to_metric_families(metrics)
               for s in f.samples if s.name == "vllm:num_requests_running"}
    assert gateway == {"m"}


async def test_each_copy_plans_the_load_of_that_copy(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("m", 1000, replicas=2)], vram_margin_mb=0,
                           gpus=[{"index": 0, "name": "sim", "vram_mb": 4000},
                                 {"index": 1, "name": "sim", "vram_mb": 2000}])
    first = coord.pool.owner("m")
    first.slot.transition(SlotState.LOADING)  # taken: the next copy asked for is a new one
    first.slot.lease = await coord.boss.acquire(kind="inference", allocations={0: 1000},
                                                note="m")
    second = coord.pool.add_replica("m")
    assert (first.key, second.key) == (slot_key("m"), slot_key("m", 2)) == ("m", "m#2")
    for owner, sibling in ((first, "m#2"), (second, "m")):
        demand = coord.pool.replica_demand(owner, 5)
        assert (demand.key, demand.model_id, demand.siblings) == (owner.key, "m", {sibling})
    # each copy's plan is its own: the first's may take the roomier GPU 0, the second's
    # keeps off its sibling's GPU
    plans = [await coord.pool.plan(owner.key, 5) for owner in (first, second)]
    assert [p.placement.allocations for p in plans if isinstance(p, Fit)] == [{0: 1000},
                                                                              {1: 1000}]


async def test_one_gpu_never_holds_two_copies_of_a_model(tmp_path):
    coord, log, gate = await held_burst(tmp_path, [{"index": 0, "name": "sim",
                                                    "vram_mb": 4000}])
    async with started_client(coord) as client:
        asking = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
                  for _ in range(3)]
        await wait_until(lambda: coord.queue.depth == 2)
        await asyncio.sleep(0.3)  # past replica_scale_wait_s, over several passes
        assert list(coord.pool.slots) == ["m"]  # the copy found no GPU and was forgotten
        gate.set()
        assert [a.status_code for a in await asyncio.gather(*asking)] == [200] * 3
    assert [e for e in log if e[0] == "start"] == [("start", "m")]


async def test_an_idle_copy_goes_by_its_keep_alive_and_leaves_no_slot(tmp_path):
    coord, log, gate = await held_burst(tmp_path, TWO_GPUS, reaper_interval_s=0.05)
    async with started_client(coord) as client:
        asking = [asyncio.create_task(client.post("/v1/chat/completions",
                                                  json={**CHAT, "x_keep_alive_s": 0.2}))
                  for _ in range(3)]
        await wait_until(lambda: "m#2" in coord.pool.slots
                         and coord.pool.slots["m#2"].state == "ready")
        gate.set()
        await asyncio.gather(*asking)
        await wait_until(lambda: "m#2" not in coord.pool.slots
                         and coord.pool.slots["m"].state == "idle", timeout_s=5)
        status = (await client.get("/api/v1/status")).json()
    assert [s["key"] for s in status["slots"]] == ["m"]
    assert status["slots"][0]["state"] == "idle" and not status["leases"]


async def test_min_copies_start_as_soon_as_the_model_is_wanted(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("m", 1000, replicas={"min": 2, "max": 2})],
                             gpus=TWO_GPUS, vram_margin_mb=0)
    async with started_client(coord) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await wait_until(lambda: len([s for s in coord.pool.slots.values()
                                      if s.state == "ready"]) == 2)
    assert [e for e in log if e[0] == "start"] == [("start", "m"), ("start", "m")]


async def two_ready_copies(client, coord, gate) -> None:
    asking = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
              for _ in range(3)]
    await wait_until(lambda: sum(s.state == "ready" for s in coord.pool.slots.values()) == 2)
    gate.set()
    await asyncio.gather(*asking)


async def test_a_removed_model_is_named_in_each_of_its_copies_model_removed(tmp_path):
    coord, _log, gate = await held_burst(tmp_path, TWO_GPUS)
    async with started_client(coord) as client:
        await two_ready_copies(client, coord, gate)
        coord.pool.catalog.adopt(Catalog([], tmp_path))  # m left the catalog
        await take_catalog_change(coord.pool, CatalogDiff(removed=["m"]), drain_s=1.0)
    removed = coord.events.recent("model_removed", model="m")
    assert sorted((e["model"], e["replica"]) for e in removed) == [("m", "m"), ("m", "m#2")]
    assert coord.pool.slots == {}


# an unload of the model, as the admin API (and the CLI through it) or Ollama asks for it
UNLOADS = [("/api/v1/models/m/unload", None, {"model": "m", "unloaded": True}),
           ("/api/chat", {"model": "m", "keep_alive": 0}, {"done_reason": "unload"})]


@pytest.mark.parametrize("path, body, said", UNLOADS, ids=["admin", "ollama keep_alive 0"])
async def test_unloading_a_model_unloads_every_copy(tmp_path, path, body, said):
    coord, log, gate = await held_burst(tmp_path, TWO_GPUS)
    async with started_client(coord) as client:
        await two_ready_copies(client, coord, gate)
        answer = await client.post(path, json=body)
        assert answer.status_code == 200 and said.items() <= answer.json().items()
        assert {k: s.state for k, s in coord.pool.slots.items()} == {"m": SlotState.IDLE}
        # each worker is stopped by a clean-up the owner spawns as it lets the copy go
        await wait_until(lambda: len([e for e in log if e[0] == "stop"]) >= 2)
        assert [e for e in log if e[0] == "stop"] == [("stop", "m"), ("stop", "m")]
    assert not await coord.pool.unload("m")  # nothing left to stop


async def test_a_busy_copy_refuses_the_unload_and_the_idle_one_goes(tmp_path):
    coord, _log, gate = await held_burst(tmp_path, TWO_GPUS)
    async with started_client(coord) as client:
        await two_ready_copies(client, coord, gate)
        gate.clear()
        busy = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        await wait_until(lambda: any(s.active for s in coord.pool.slots.values()))
        serving = next(k for k, s in coord.pool.slots.items() if s.active)
        answer = await client.post("/api/v1/models/m/unload")
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "model_busy"
        states = {k: s.state for k, s in coord.pool.slots.items()}
        assert states[serving] == SlotState.READY  # it goes on serving
        assert all(state == SlotState.IDLE for k, state in states.items() if k != serving)
        gate.set()
        assert (await busy).status_code == 200


async def test_a_model_served_by_its_second_copy_alone_is_ready(tmp_path):
    coord, _log, gate = await held_burst(tmp_path, TWO_GPUS)
    async with started_client(coord) as client:
        await two_ready_copies(client, coord, gate)
        assert await coord.pool.owners[slot_key("m")].unload("test: the first copy goes")
        assert coord.pool.slots[slot_key("m", 2)].state == SlotState.READY
        cards = (await client.get("/v1/models")).json()["data"]
    assert next(c for c in cards if c["id"] == "m")["state"] == "ready"


async def test_two_copies_loading_at_once_take_different_gpus(tmp_path):
    """Both plan while neither holds its lease yet: the first to decide claims its GPU
    before it waits for the lease, and the other, deciding after its own read, avoids it
    (both would fit on either GPU)."""
    coord, _ = coordinator(tmp_path, [manifest("m", 500, replicas=2)],
                           gpus=[{"index": 0, "name": "sim", "vram_mb": 4000},
                                 {"index": 1, "name": "sim", "vram_mb": 4000}],
                           vram_margin_mb=0)
    async with started_client(coord):
        first = coord.pool.owner("m")
        loads = [first.start_load(5)]
        second = coord.pool.add_replica("m")  # the first is busy loading: a new copy
        assert second is not first
        loads.append(second.start_load(5))
        await asyncio.gather(*loads)
        gpus = [set(owner.slot.lease.allocations) for owner in (first, second)]
        assert gpus[0].isdisjoint(gpus[1]), gpus
