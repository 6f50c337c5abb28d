"""Queue limits: a model's max_concurrency (the rest wait), queue limits per model, per client
and in all (429 with Retry-After), all visible in /metrics; aged priority drives eviction."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_boss.errors import RateLimited
from model_boss.observability.refresh import refresh_metrics
from model_boss.scheduling.queue import QueuedRequest
from model_boss.slots.slot import SlotState

from .fakes import coordinator, manifest


async def hold(coord, model, client="c", **kw):
    return await asyncio.wait_for(coord.queue.acquire(
        QueuedRequest(model_id=model, priority=5, client_id=client, **kw)), 2)


async def test_max_concurrency_makes_the_rest_wait(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", parallel=4, max_concurrency=2)])
    await coord.start()
    try:
        first, second = await hold(coord, "a", "x"), await hold(coord, "a", "y")
        third = asyncio.create_task(hold(coord, "a", "z"))
        await asyncio.sleep(0.05)
        assert not third.done() and coord.queue.depth == 1
        assert coord.pool.slots["a"].active == 2
        first.release()
        (await asyncio.wait_for(third, 2)).release()
        second.release()
    finally:
        await coord.stop()


def test_max_concurrency_above_parallel_is_a_config_error():
    from model_boss.catalog.manifest import ModelManifest

    with pytest.raises(ValueError, match="at most the parallel slots"):
        ModelManifest(id="a", path="x.gguf", parallel=2, max_concurrency=3)


@pytest.mark.parametrize("limits, clients, code", [
    ({"max_queue_depth": 2}, ["x", "y", "z"], "queue_full"),
    ({"max_queued_per_client": 2}, ["x", "x", "x"], "client_queue_full"),
    ({}, ["x", "y", "z"], "model_queue_full"),   # the manifest's max_queued: 2
])
async def test_queue_limits_answer_429(tmp_path, limits, clients, code):
    coord, _ = coordinator(tmp_path, [manifest("a", max_queued=2 if not limits else None)],
                           **limits)
    await coord.start()
    try:
        holder = await hold(coord, "a", "holder")
        waiting = [asyncio.create_task(hold(coord, "a", c)) for c in clients[:2]]
        await asyncio.sleep(0.05)
        with pytest.raises(RateLimited) as refused:
            await hold(coord, "a", clients[2])
        assert refused.value.status_code == 429 and refused.value.code == code
        assert refused.value.retry_after_s >= 1
        holder.release()
        for task in waiting:
            (await asyncio.wait_for(task, 2)).release()
        await refresh_metrics(coord.metrics, coord.queue, coord.boss, coord.pool, coord.settings)
        text = coord.metrics.render().decode()
        assert f'model_boss_queue_rejected_total{{model="a",reason="{code}"}} 1.0' in text
        assert 'model_boss_queue_limit{scope="per_client"}' in text
        assert 'model_boss_model_max_concurrency{model="a"} 1.0' in text
        assert "model_boss_queue_wait_seconds_count" in text
    finally:
        await coord.stop()


async def test_an_aged_request_evicts_an_idle_model_a_more_important_client_used(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a"), manifest("b")], aging_s=0.5)
    await coord.start()
    try:
        (await asyncio.wait_for(coord.queue.acquire(
            QueuedRequest(model_id="a", priority=0, client_id="vip")), 2)).release()
        assert coord.pool.slots["a"].state == SlotState.READY
        started = time.monotonic()
        ticket = await asyncio.wait_for(coord.queue.acquire(
            QueuedRequest(model_id="b", priority=9, client_id="batch")), 10)
        ticket.release()
        waited = time.monotonic() - started
        # 9 levels × 0.5 s of aging, then "a" (idle, inside its keep-alive) is evicted
        assert 4.0 <= waited < 6.0, waited
        assert coord.pool.slots["a"].state == SlotState.IDLE
    finally:
        await coord.stop()


async def test_priority_9_gets_through_endless_priority_0_traffic_within_the_bound(tmp_path):
    from model_boss.scheduling.ordering import wait_bound_s

    coord, _ = coordinator(tmp_path, [manifest("a"), manifest("b")], aging_s=0.2)
    await coord.start()
    stop = asyncio.Event()
    served_a = []

    async def interactive(client):
        while not stop.is_set():
            ticket = await coord.queue.acquire(
                QueuedRequest(model_id="a", priority=0, client_id=client))
            await asyncio.sleep(0.05)
            ticket.release()
            served_a.append(time.monotonic())

    floods = [asyncio.create_task(interactive(f"c{i}")) for i in range(3)]
    try:
        await asyncio.sleep(0.3)
        started = time.monotonic()
        ticket = await asyncio.wait_for(coord.queue.acquire(
            QueuedRequest(model_id="b", priority=9, client_id="batch")), 10)
        waited = time.monotonic() - started
        ticket.release()
        await asyncio.sleep(0.3)
        assert any(t > started + waited for t in served_a)  # A's traffic went on after
    finally:
        stop.set()
        for task in floods:
            task.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
        await coord.stop()
    bound = wait_bound_s(9, most_important=0, aging_s=0.2, warm_credit_s=1.0, drain_s=0.05,
                         load_s=0.1)
    assert 9 * 0.2 <= waited <= bound + 0.5, (waited, bound)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 11), st.sampled_from("ab"),
                          st.sampled_from("xyz"), st.integers(0, 3)), max_size=60))
def test_the_backlogs_counts_are_what_a_scan_of_it_finds(steps):
    """The counts the queue reads on each arrival (fair-share rank, queue limits, budget
    predictions) equal a scan of the waiting requests, whatever came and went."""
    from model_boss.scheduling.ordering import fair_rank, rank_on_arrival
    from model_boss.scheduling.request import Backlog

    loop = asyncio.new_event_loop()
    try:
        made = [loop.run_until_complete(_request(model, client, priority))
                for _, _, model, client, priority in steps]
    finally:
        loop.close()
    backlog, waiting = Backlog(), []
    for (add, pick, *_), request in zip(steps, made, strict=True):
        if add or not waiting:
            backlog.add(request)
            waiting.append(request)
        else:
            gone = waiting.pop(pick % len(waiting))
            assert backlog.discard(gone) and not backlog.discard(gone)
        assert list(backlog) == waiting and len(backlog) == len(waiting)
        for model in "ab":
            assert backlog.of_model(model) == sum(r.model_id == model for r in waiting)
            for p in range(4):
                assert backlog.of_model(model, p) == sum(
                    r.model_id == model and r.priority <= p for r in waiting)
        for client in "xyz":
            for p in range(4):
                scanned = rank_on_arrival((r.waiter for r in waiting), client, p, 2.0)
                assert fair_rank(backlog.of_client(client, p), 2.0) == scanned


async def _request(model: str, client: str, priority: int):
    from model_boss.scheduling.request import QueuedRequest

    return QueuedRequest(model_id=model, priority=priority, client_id=client)


async def test_a_full_queue_refuses_before_the_body_is_read(tmp_path):
    """Over the limits, a request is refused before its body is parsed (a body that is not
    even JSON gets the 429), in each route's envelope, with Retry-After; the status lists
    only the first waiters but counts them all."""
    import httpx

    from model_boss.api.app import create_app
    from model_boss.scheduling.waiting import queue_status

    coord, _ = coordinator(tmp_path, [manifest("a")], max_queue_depth=3,
                           max_queued_per_client=2)
    app = create_app(coordinator=coord)
    await coord.start()
    try:
        holder = await hold(coord, "a", "holder")
        waiting = [asyncio.create_task(queued(coord, c)) for c in ("x", "x")]
        await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            mine = await client.post("/v1/chat/completions", content=b"not json",
                                     headers={"x-client-id": "x"})
            other = await client.post("/v1/chat/completions", content=b"not json",
                                      headers={"x-client-id": "y"})
            waiting.append(asyncio.create_task(queued(coord, "y")))
            await asyncio.sleep(0.05)
            full = {path: await client.post(path, content=b"{")
                    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat",
                                 "/completion", "/v1/embeddings")}
            whole = (await client.get("/api/v1/status")).json()
            status = whole["queue"]
            admin = await client.get("/api/v1/models")
        assert mine.status_code == 429 and mine.headers["retry-after"]
        assert mine.json()["error"]["code"] == "client_queue_full"
        assert other.status_code == 400  # room for y: the route parses it, and says why
        assert {path: r.status_code for path, r in full.items()} == dict.fromkeys(full, 429)
        assert full["/v1/chat/completions"].json()["error"]["code"] == "queue_full"
        assert full["/v1/messages"].json()["error"]["type"] == "rate_limit_error"
        assert full["/v1/messages"].json()["type"] == "error"
        assert "queue is full" in full["/api/chat"].json()["error"]
        assert all(int(r.headers["retry-after"]) >= 1 for r in full.values())
        assert admin.status_code == 200  # only the routes that queue are refused
        assert status["depth"] == 3 and status["by_model"] == {"a": 3}
        assert status["by_priority"] == {"5": 3}
        assert {m["id"]: m["queued"] for m in whole["models"]} == {"a": 3}
        assert len(queue_status(coord.queue, shown=2)["waiting"]) == 2
        await refresh_metrics(coord.metrics, coord.queue, coord.boss, coord.pool, coord.settings)
        text = coord.metrics.render().decode()
        assert 'model_boss_queue_rejected_total{model="",reason="queue_full"} 5.0' in text
        holder.release()
        for granted in asyncio.as_completed(waiting, timeout=10):  # y is served before x's 2nd
            (await granted).release()
    finally:
        await coord.stop()


async def queued(coord, client):
    """A request that waits as long as the test needs (``hold`` gives up after 2 s)."""
    return await asyncio.wait_for(coord.queue.acquire(
        QueuedRequest(model_id="a", priority=5, client_id=client)), 60)


async def test_requests_on_their_way_in_count_at_the_gate_only(tmp_path):
    """A burst: requests let through the gate fill the limits before any is queued, so the
    rest are refused at the gate; one that reaches the queue stops counting as arriving, and
    the queue's own check counts only what is queued (no request is refused twice over)."""
    from model_boss.scheduling.request import ARRIVING

    coord, _ = coordinator(tmp_path, [manifest("a")], max_queue_depth=3,
                           max_queued_per_client=2)
    await coord.start()
    try:
        queue = coord.queue
        holder = await hold(coord, "a", "holder")
        assert queue.refusal("x") is None
        leaving = [queue.arrivals.enter("x"), queue.arrivals.enter("x")]
        assert queue.refusal("x").code == "client_queue_full"  # x's two are on their way
        assert queue.refusal("y") is None and queue.refusal(None) is None
        leaving.append(queue.arrivals.enter("y"))
        assert queue.refusal("z").code == "queue_full" and queue.depth == 0

        async def arrive(leave, client):
            ARRIVING.set(leave)  # as the gate does, in the request's own context
            return await queued(coord, client)

        waiting = [asyncio.create_task(arrive(leave, client))
                   for leave, client in zip(leaving, ("x", "x", "y"), strict=True)]
        await asyncio.sleep(0.05)
        assert queue.depth == 3 and queue.arrivals.total == 0
        assert dict(queue.arrivals.by_client) == {}
        assert queue.refusal("z").code == "queue_full"  # now by the queue itself
        leaving[0]()  # a second call changes nothing
        assert queue.arrivals.total == 0
        holder.release()
        for granted in asyncio.as_completed(waiting, timeout=10):
            (await granted).release()
        assert queue.refusal("z") is None
    finally:
        await coord.stop()
