"""Races between requests and slot lifecycle, driven step by step through gated backends.

Each test holds one backend step open, makes the competing move while it is held, and checks
the promise: a request is granted only on a READY slot whose worker is alive and whose lease
is in the lease store; no two leases share VRAM; one load per model at a time.
"""

from __future__ import annotations

import asyncio

import pytest

from model_boss.errors import CapacityExceeded, LoadFailed
from model_boss.scheduling.queue import QueuedRequest
from model_boss.slots.slot import SlotState

from .fakes import manifest
from .gated import gated_coordinator, steps

S = SlotState


async def acquire(coord, model: str, priority: int = 5):
    ticket = await coord.queue.acquire(QueuedRequest(model_id=model, priority=priority))
    await assert_granted_honestly(coord, ticket)
    return ticket


async def assert_granted_honestly(coord, ticket) -> None:
    slot = ticket.slot
    assert slot.state == S.READY, f"granted on a {slot.state} slot"
    assert slot.backend is not None and slot.backend.alive, "granted on a dead worker"
    held = {lease.id for lease in await coord.boss.leases()}
    assert slot.lease is not None and slot.lease.id in held, "granted without a held lease"


async def assert_no_overlap(coord) -> None:
    for usage in await coord.boss.usage():
        assert usage.leased_mb <= usage.capacity_mb


@pytest.fixture
async def two_models(tmp_path):
    """A GPU that holds one of two 3000 MB models; "p" can be parked in CPU RAM."""
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p"), manifest("q")],
                                          offloadable={"p"})
    await coord.start()
    yield coord, gates, log
    await coord.stop()


async def test_offload_vs_grant(two_models):
    coord, gates, log = two_models
    (await acquire(coord, "p")).release()
    slot = coord.pool.slots["p"]
    gates.hold("offload")
    offload = asyncio.create_task(coord.pool.offload("p"))
    await gates.reached("offload")
    assert slot.state == S.OFFLOADING  # set before the first await: no grant from here on
    request = asyncio.create_task(acquire(coord, "p"))
    await asyncio.sleep(0.05)
    assert not request.done() and slot.active == 0
    gates.open("offload")
    assert await offload
    ticket = await asyncio.wait_for(request, 2)  # onloaded into the same worker, leased again
    assert steps(log, "onload", "p") == 1 and steps(log, "start", "p") == 1
    ticket.release()
    await assert_no_overlap(coord)


async def test_eviction_offload_vs_grant(two_models):
    """The eviction path: q needs p's VRAM, p goes to CPU RAM while a request for p comes."""
    coord, gates, log = two_models
    (await acquire(coord, "p")).release()
    gates.hold("offload")
    for_q = asyncio.create_task(acquire(coord, "q"))
    await gates.reached("offload")
    for_p = asyncio.create_task(acquire(coord, "p"))
    await asyncio.sleep(0.05)
    assert not for_p.done(), "granted on a slot whose weights are leaving the GPU"
    assert coord.pool.slots["p"].state == S.OFFLOADING
    gates.open("offload")
    ticket_q = await asyncio.wait_for(for_q, 2)
    assert coord.pool.slots["p"].state == S.OFFLOADED and coord.pool.slots["p"].lease is None
    await asyncio.sleep(0.05)
    assert not for_p.done()  # q is busy: p waits rather than share its VRAM
    ticket_q.release()
    ticket_p = await asyncio.wait_for(for_p, 2)
    assert coord.pool.slots["q"].state == S.IDLE
    ticket_p.release()
    await assert_no_overlap(coord)


async def test_admin_load_joins_request_load(two_models):
    coord, gates, log = two_models
    gates.hold("start")
    request = asyncio.create_task(acquire(coord, "q"))
    await gates.reached("start")
    admin = asyncio.create_task(coord.pool.ensure_ready("q", 5))
    await asyncio.sleep(0.05)
    assert not admin.done()  # it waits for the same load instead of failing
    gates.open("start")
    slot = await asyncio.wait_for(admin, 2)
    ticket = await asyncio.wait_for(request, 2)
    assert slot.state == S.READY and ticket.slot is slot
    assert steps(log, "start", "q") == 1
    ticket.release()


async def test_request_load_joins_admin_load(two_models):
    coord, gates, log = two_models
    gates.hold("start")
    admin = asyncio.create_task(coord.pool.ensure_ready("q", 5))
    await gates.reached("start")
    request = asyncio.create_task(acquire(coord, "q"))
    again = asyncio.create_task(coord.pool.ensure_ready("q", 1))
    await asyncio.sleep(0.05)
    gates.open("start")
    await asyncio.wait_for(asyncio.gather(admin, again), 2)
    (await asyncio.wait_for(request, 2)).release()
    assert steps(log, "start", "q") == 1


async def test_dead_worker_is_never_granted(two_models):
    coord, gates, log = two_models
    (await acquire(coord, "p")).release()
    old = coord.pool.slots["p"].backend
    old.die()  # SIGKILLed; the exit watcher has not run yet
    ticket = await asyncio.wait_for(acquire(coord, "p"), 2)
    assert ticket.slot.backend is not old and steps(log, "start", "p") == 2
    ticket.release()
    assert len(await coord.boss.leases()) == 1


async def test_crash_reported_while_granted_request_runs(two_models):
    coord, gates, log = two_models
    ticket = await acquire(coord, "p")
    backend = ticket.slot.backend
    backend.die()
    backend.on_exit(-9)
    assert ticket.slot.state == S.IDLE  # synchronously, before any other grant
    await asyncio.sleep(0.05)
    assert await coord.boss.leases() == []
    ticket.release()
    (await asyncio.wait_for(acquire(coord, "p"), 2)).release()


async def test_lease_loss_vs_grant(two_models):
    coord, gates, log = two_models
    (await acquire(coord, "q")).release()
    slot = coord.pool.slots["q"]
    lost = slot.lease
    await coord.boss.store.release(lost.id)  # the store forgot it (say, Redis restarted)
    coord.pool.lease_lost(lost, "gone after a store restart")
    assert slot.state != S.READY  # out of READY before anything else can run
    ticket = await asyncio.wait_for(acquire(coord, "q"), 2)
    assert ticket.slot.lease.id != lost.id and steps(log, "start", "q") == 2
    ticket.release()
    await assert_no_overlap(coord)


async def test_lease_lost_while_loading_fails_the_load(two_models):
    coord, gates, log = two_models
    gates.hold("start")
    load = asyncio.create_task(coord.pool.ensure_ready("q", 5))
    await gates.reached("start")
    slot = coord.pool.slots["q"]
    coord.pool.lease_lost(slot.lease, "taken")
    gates.open("start")
    with pytest.raises(LoadFailed, match="lost its VRAM lease"):
        await asyncio.wait_for(load, 2)
    assert slot.state == S.IDLE and slot.backend is None
    assert await coord.boss.leases() == []


async def test_unload_waits_for_a_running_stream(two_models):
    coord, gates, log = two_models
    streaming = await acquire(coord, "q")
    slot = streaming.slot
    unload = asyncio.create_task(coord.pool.unload("q", wait_s=5))
    await asyncio.sleep(0.05)
    assert slot.state == S.DRAINING and not unload.done()
    newcomer = asyncio.create_task(acquire(coord, "q"))
    await asyncio.sleep(0.05)
    assert not newcomer.done() and slot.active == 1  # no grant on a draining slot
    streaming.release()
    assert await asyncio.wait_for(unload, 2)
    ticket = await asyncio.wait_for(newcomer, 2)  # it reloads after the unload
    assert steps(log, "start", "q") == 2 and steps(log, "stop", "q") == 1
    ticket.release()


async def test_unload_gives_up_on_a_busy_slot(two_models):
    coord, gates, log = two_models
    streaming = await acquire(coord, "q")
    with pytest.raises(CapacityExceeded) as busy:
        await coord.pool.unload("q")
    assert busy.value.status_code == 409
    with pytest.raises(CapacityExceeded):
        await coord.pool.unload("q", wait_s=0.05)
    assert streaming.slot.state == S.READY  # back to serving after giving up
    streaming.release()
    (await asyncio.wait_for(acquire(coord, "q"), 2)).release()


async def test_unload_during_load_waits_for_it(two_models):
    coord, gates, log = two_models
    gates.hold("start")
    load = asyncio.create_task(coord.pool.ensure_ready("q", 5))
    await gates.reached("start")
    unload = asyncio.create_task(coord.pool.unload("q"))
    await asyncio.sleep(0.05)
    assert not unload.done()
    gates.open("start")
    await load
    assert await asyncio.wait_for(unload, 2)
    assert coord.pool.slots["q"].state == S.IDLE and await coord.boss.leases() == []


async def test_two_loads_never_share_vram(tmp_path):
    """Both models fit only one at a time; both are asked for at once."""
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p"), manifest("q")])
    await coord.start()
    try:
        gates.hold("start")
        first = asyncio.create_task(coord.pool.ensure_ready("p", 5))
        second = asyncio.create_task(coord.pool.ensure_ready("q", 5))
        await gates.reached("start")
        await asyncio.sleep(0.05)
        assert len(await coord.boss.leases()) == 1  # the second waits for room
        gates.open("start")
        results = await asyncio.gather(first, second, return_exceptions=True)
        await assert_no_overlap(coord)
        assert any(not isinstance(r, BaseException) for r in results)
    finally:
        await coord.stop()


async def test_unhealthy_worker_is_taken_out_of_ready(two_models):
    coord, gates, log = two_models
    (await acquire(coord, "q")).release()
    slot = coord.pool.slots["q"]
    owner = coord.pool.owner("q")
    slot.backend.alive = True

    async def unhealthy() -> bool:
        return False

    slot.backend.health_check = unhealthy
    assert not await owner.check_health() and slot.state == S.READY  # one miss is not enough
    await owner.check_health()
    await owner.check_health()
    assert slot.state != S.READY and "health checks" in slot.last_error
    ticket = await asyncio.wait_for(acquire(coord, "q"), 2)  # reloaded on a fresh worker
    assert steps(log, "start", "q") == 2
    ticket.release()


async def test_admin_load_over_http_joins_a_request_load(tmp_path):
    """POST /api/v1/models/{id}/load while a request loads the same model: one load, 200."""
    import httpx

    from model_boss.api.app import create_app

    coord, gates, log = gated_coordinator(tmp_path, [manifest("q")])
    app = create_app(coordinator=coord)
    await coord.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            gates.hold("start")
            chat = asyncio.create_task(client.post("/v1/chat/completions", json={
                "model": "q", "messages": [{"role": "user", "content": "hi"}]}))
            await gates.reached("start")
            admin = asyncio.create_task(client.post("/api/v1/models/q/load"))
            await asyncio.sleep(0.05)
            gates.open("start")
            loaded, answered = await asyncio.wait_for(asyncio.gather(admin, chat), 5)
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["state"] == "ready" and answered.status_code == 200
        assert steps(log, "start", "q") == 1
    finally:
        await coord.stop()


async def test_a_save_on_the_way_out_holds_the_vram_until_the_worker_is_gone(two_models):
    """An evicted llama model saves its prompt caches before it stops: all that time its lease
    holds the VRAM, so the model that evicted it starts only after the worker is gone."""
    coord, gates, log = two_models
    (await acquire(coord, "q")).release()  # q cannot be parked: eviction stops it
    gates.hold("retire")
    wanted = asyncio.create_task(acquire(coord, "p"))
    await gates.reached("retire")
    assert coord.pool.slots["q"].state == S.STOPPING
    await asyncio.sleep(0.05)
    assert steps(log, "start", "p") == 0  # no second model in the VRAM q still holds
    await assert_no_overlap(coord)
    gates.open("retire")
    (await asyncio.wait_for(wanted, 2)).release()
    order = [step for step, model, _ in log if (step, model) in
             {("retire", "q"), ("stop", "q"), ("start", "p")}]
    assert order == ["retire", "stop", "start"]


async def test_a_crashed_worker_is_not_saved(two_models):
    coord, gates, log = two_models
    (await acquire(coord, "q")).release()
    backend = coord.pool.slots["q"].backend
    backend.die()
    coord.pool.owner("q").worker_exited(backend, -9)
    await asyncio.sleep(0.05)
    assert steps(log, "retire", "q") == 0 and steps(log, "stop", "q") == 1
