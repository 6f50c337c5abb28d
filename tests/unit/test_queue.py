"""InferenceQueue and ModelPool together, with in-process backends (no processes)."""

from __future__ import annotations

import asyncio

import pytest

from model_boss.errors import BudgetExceeded, CapacityExceeded
from model_boss.scheduling.queue import QueuedRequest
from model_boss.slots.slot import SlotState

from .fakes import FakeBackend, coordinator, manifest


@pytest.fixture
async def coord_two(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("a"), manifest("b"), manifest("small", 100)])
    await coord.start()
    yield coord, log
    await coord.stop()


async def run(coord, model, priority=5, **kw):
    ticket = await coord.queue.acquire(QueuedRequest(model_id=model, priority=priority, **kw))
    ticket.release()
    return ticket


async def test_load_then_evict_one_at_a_time(coord_two):
    coord, log = coord_two
    await run(coord, "a")
    assert coord.pool.slots["a"].state == SlotState.READY
    await run(coord, "b")
    assert coord.pool.slots["a"].state == SlotState.IDLE
    assert coord.pool.slots["b"].state == SlotState.READY
    assert log == [("start", "a"), ("stop", "a"), ("start", "b")]
    usage = (await coord.boss.usage())[0]
    assert usage.leased_mb == 3000


async def test_priority_order_and_warm_bump(coord_two):
    coord, _log = coord_two
    await run(coord, "a")
    order = []
    gate = asyncio.Event()

    async def one(model, priority, tag):
        ticket = await coord.queue.acquire(QueuedRequest(model_id=model, priority=priority))
        order.append(tag)
        await gate.wait()
        ticket.release()

    # Hold the only slot of "a" so that everything else queues.
    holder = await coord.queue.acquire(QueuedRequest(model_id="a", priority=0))
    tasks = [asyncio.create_task(one("a", 5, "a5-first")),
             asyncio.create_task(one("a", 9, "a9")),
             asyncio.create_task(one("a", 1, "a1")),
             asyncio.create_task(one("a", 5, "a5-second"))]
    await asyncio.sleep(0.05)
    assert coord.queue.depth == 4
    holder.release()
    gate.set()
    await asyncio.gather(*tasks)
    assert order == ["a1", "a5-first", "a5-second", "a9"]


async def test_warm_requests_go_before_cold_within_a_priority(coord_two):
    coord, _ = coord_two
    await run(coord, "small")  # small is READY; a is cold
    cold = QueuedRequest(model_id="a", priority=5, submitted_at=1.0, client_id="x")
    warm = QueuedRequest(model_id="small", priority=5, submitted_at=1.5, client_id="y")
    urgent_cold = QueuedRequest(model_id="a", priority=1, submitted_at=3.0, client_id="z")
    for request in (cold, warm, urgent_cold):
        coord.queue._pending.add(request)
    try:
        assert coord.queue.ordered() == [urgent_cold, warm, cold]
        assert coord.queue.wanted_models() == ("a", "small")
    finally:
        for request in (cold, warm, urgent_cold):
            coord.queue._pending.discard(request)


async def test_waiting_model_does_not_block_others(tmp_path):
    coord, _log = coordinator(tmp_path, [manifest("big", 3000, pin=True),
                                        manifest("other-big", 3000), manifest("small", 100)])
    await coord.start()
    try:
        await run(coord, "big")
        gate = asyncio.Event()
        coord.pool.slots["big"].backend.gate = gate
        # other-big can never fit beside the pinned model: it is refused at once...
        with pytest.raises(CapacityExceeded, match="pinned"):
            await run(coord, "other-big")
        # ...while small loads beside it and is served.
        await asyncio.wait_for(run(coord, "small"), 2)
        assert coord.pool.slots["small"].state == SlotState.READY
    finally:
        await coord.stop()


async def test_busy_model_blocks_only_its_waiters(coord_two):
    coord, _log = coord_two
    holder = await coord.queue.acquire(QueuedRequest(model_id="a", priority=5))
    waiting_b = asyncio.create_task(run(coord, "b", priority=5))
    await asyncio.sleep(0.05)
    assert not waiting_b.done()  # a is busy: it cannot be evicted yet
    assert await asyncio.wait_for(run(coord, "small"), 2)  # small fits beside a
    holder.release()
    await asyncio.wait_for(waiting_b, 2)
    assert coord.pool.slots["b"].state == SlotState.READY


async def test_budget_runs_out_while_waiting(coord_two):
    coord, _ = coord_two
    await run(coord, "a", priority=0)
    with pytest.raises(BudgetExceeded) as caught:
        await run(coord, "b", priority=9, budget_s=0.3)
    assert caught.value.retry_after_s and caught.value.status_code == 503
    assert coord.pool.slots["a"].state == SlotState.READY


async def test_cancelled_waiter_leaves_the_queue(coord_two):
    coord, _ = coord_two
    holder = await coord.queue.acquire(QueuedRequest(model_id="a", priority=5))
    waiter = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="a", priority=5)))
    await asyncio.sleep(0.05)
    assert coord.queue.depth == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert coord.queue.depth == 0
    holder.release()
    assert coord.pool.slots["a"].active == 0


async def test_load_failure_fails_waiters_and_frees_lease(tmp_path):
    from model_boss.errors import LoadFailed

    coord, log = coordinator(tmp_path, [manifest("a")])
    coord.pool.backend_factory = lambda entry, s: FakeBackend(
        entry, s, log, fail=LoadFailed("worker exited with 1 while loading: boom"))
    await coord.start()
    try:
        with pytest.raises(LoadFailed, match="boom"):
            await run(coord, "a")
        assert coord.pool.slots["a"].state == SlotState.IDLE
        assert (await coord.boss.usage())[0].leased_mb == 0
    finally:
        await coord.stop()


async def test_worker_exit_returns_slot_to_idle(coord_two):
    coord, _ = coord_two
    await run(coord, "a")
    backend = coord.pool.slots["a"].backend
    backend.on_exit(-9)
    slot = coord.pool.slots["a"]
    async with asyncio.timeout(10):  # the exit is handled in a task of its own
        while slot.state != SlotState.IDLE or (await coord.boss.usage())[0].leased_mb:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert slot.last_error == "worker stopped unexpectedly (killed by signal 9 (SIGKILL))"
    await run(coord, "a")
    assert slot.state == SlotState.READY and slot.loads == 2


async def test_client_max_concurrency(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", parallel=4)])
    await coord.start()
    try:
        first = await coord.queue.acquire(QueuedRequest(model_id="a", priority=5,
                                                        client_id="c", max_concurrency=1))
        second = asyncio.create_task(coord.queue.acquire(
            QueuedRequest(model_id="a", priority=5, client_id="c", max_concurrency=1)))
        other = await asyncio.wait_for(coord.queue.acquire(
            QueuedRequest(model_id="a", priority=5, client_id="d")), 1)
        await asyncio.sleep(0.05)
        assert not second.done()
        first.release()
        (await asyncio.wait_for(second, 1)).release()
        other.release()
    finally:
        await coord.stop()


async def test_request_log_replays_in_the_simulator(tmp_path):
    from model_boss.simulation.simulator import BASELINES, simulate
    from model_boss.simulation.traces import jsonl_trace

    coord, _ = coordinator(tmp_path, [manifest("a", 3000), manifest("b", 3000)])
    await coord.start()
    try:
        for model, priority in [("a", 5), ("b", 1), ("a", 0)]:
            await run(coord, model, priority=priority)
    finally:
        await coord.stop()
    path = coord.settings.state_path / "requests.jsonl"
    trace = jsonl_trace(path, capacity_mb=3584)
    assert [(r.model, r.priority) for r in trace.requests] == [("a", 5), ("b", 1), ("a", 0)]
    assert trace.sizes == {"a": 3000, "b": 3000}
    assert simulate(trace, BASELINES[0]).cold_loads == 3


@pytest.mark.parametrize("budget_s, given_s, words", [
    (0.5, None, "exceeds the budget of 0.5s"),
    (0.5, 0.5, "exceeds the budget of 0.5s"),
    # what is left after a first rung was tried, against the budget as the client gave it
    (0.000997787, 2.0, "exceeds the 0.00s left of the budget of 2s"),
])
def test_a_budget_refusal_says_the_budget_as_given(budget_s, given_s, words):
    from model_boss.scheduling.budget import Prediction, admit

    decision = admit(budget_s, Prediction(1.0, 2.0, 3.0), given_s)
    assert not decision.admitted and decision.reason.endswith(words)
    error = BudgetExceeded(decision.reason).envelope()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "budget_exceeded"


async def test_a_freed_slot_goes_to_its_next_waiter_in_the_same_step(coord_two):
    """The release hands the slot on itself, as the next pass would: a long queue's turns do
    not wait for the dispatch loop's turn."""
    coord, _ = coord_two
    holder = await coord.queue.acquire(QueuedRequest(model_id="a", priority=5))
    following = QueuedRequest(model_id="a", priority=5)
    waiter = asyncio.create_task(coord.queue.acquire(following))
    await asyncio.sleep(0.05)
    assert not following.future.done()
    holder.release()
    assert following.future.done()  # granted in the release's own step, before any pass
    assert coord.pool.slots["a"].active == 1
    assert not coord.queue._wake.is_set()  # full again, as it was: no pass to run
    (await waiter).release()
    assert coord.pool.slots["a"].active == 0


async def test_a_freed_slot_is_left_to_the_pass_when_another_model_is_first(coord_two):
    """When the first waiter in order is another model's, the release hands nothing on: the
    pass decides (here: the freed slot's own waiter, the other model being busy)."""
    coord, _ = coord_two
    holder = await coord.queue.acquire(QueuedRequest(model_id="a", priority=5))
    busy = await coord.queue.acquire(QueuedRequest(model_id="small", priority=5))
    first, following = (QueuedRequest(model_id="small", priority=1),
                        QueuedRequest(model_id="a", priority=5))
    for_small = asyncio.create_task(coord.queue.acquire(first))
    for_a = asyncio.create_task(coord.queue.acquire(following))
    await asyncio.sleep(0.05)
    assert [r.model_id for r in coord.queue.ordered()] == ["small", "a"]
    holder.release()
    assert not following.future.done()  # not in the release's step
    (await asyncio.wait_for(for_a, 2)).release()  # the pass's
    assert not first.future.done()
    busy.release()
    (await asyncio.wait_for(for_small, 2)).release()
