"""Failure cooldowns: per model, never for a client's own mistakes, never shared by strangers."""

from __future__ import annotations

import asyncio

import pytest

from model_boss.errors import ModelUnavailable
from model_boss.scheduling.queue import QueuedRequest
from model_boss.scheduling.requestors import RequestorRegistry
from model_boss.scheduling.waiting import queue_status
from model_boss.tenancy.usage import Figures

from .fakes import coordinator, manifest

NOW = 1_000_000.0


def fail(registry: RequestorRegistry, times: int, *, model: str = "a",
         client: str = "anonymous", client_fault: bool = False) -> None:
    for _ in range(times):
        registry.finished(client, model, ok=False, latency_s=0.1, client_fault=client_fault,
                          now=NOW)


def test_client_faults_never_count():
    registry = RequestorRegistry(failure_threshold=5, cooldown_s=30)
    fail(registry, 50, client_fault=True)
    assert registry.cooldown_left("a", now=NOW) == 0
    assert registry.health("a").consecutive_failures == 0
    assert registry.get("anonymous").client_errors == 50
    assert registry.get("anonymous").failed == 0


def test_a_client_fault_neither_counts_nor_ends_a_run_of_failures():
    registry = RequestorRegistry(failure_threshold=3, cooldown_s=30)
    fail(registry, 2)
    fail(registry, 1, client_fault=True)
    fail(registry, 1)
    assert registry.cooldown_left("a", now=NOW) == 30


def test_a_models_failures_cool_down_that_model_only():
    registry = RequestorRegistry(failure_threshold=5, cooldown_s=30)
    fail(registry, 4, model="a", client="alice")
    assert registry.cooldown_left("a", now=NOW) == 0
    fail(registry, 1, model="a", client="bob")  # whoever asked: the run is the model's
    assert registry.cooldown_left("a", now=NOW) == 30
    assert registry.cooldown_left("a", now=NOW + 31) == 0
    assert registry.cooldown_left("b", now=NOW) == 0
    assert [m["model"] for m in registry.models_failing()] == ["a"]


def test_a_success_ends_the_run():
    registry = RequestorRegistry(failure_threshold=5, cooldown_s=30)
    fail(registry, 4)
    registry.finished("anonymous", "a", ok=True, latency_s=0.1)
    fail(registry, 4)
    assert registry.cooldown_left("a", now=NOW) == 0
    assert registry.models_failing()[0]["consecutive_failures"] == 4


def test_clients_carry_no_cooldown_of_their_own():
    registry = RequestorRegistry(failure_threshold=2, cooldown_s=30)
    fail(registry, 10, model="a")  # anonymous callers fail a lot on one model ...
    stats = registry.get("anonymous").to_dict()
    assert "cooldown_until" not in stats and stats["failed"] == 10
    assert registry.cooldown_left("b", now=NOW) == 0  # ... and nothing stops them elsewhere


@pytest.fixture
async def queue(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000), manifest("b", 1000)])
    await coord.start()
    yield coord.queue
    await coord.stop()


async def finish(queue, model: str, *, ok: bool, client_fault: bool = False,
                 client: str = "anonymous") -> None:
    ticket = await queue.acquire(QueuedRequest(model_id=model, priority=5, client_id=client))
    ticket.release(ok=ok, client_fault=client_fault)


async def test_queue_refuses_a_cooling_model_to_everyone_and_serves_the_others(queue):
    threshold = queue.requestors.failure_threshold
    for _ in range(threshold):
        await finish(queue, "a", ok=False)
    for client in ("anonymous", "someone-else"):
        with pytest.raises(ModelUnavailable) as refused:
            await finish(queue, "a", ok=True, client=client)
        assert refused.value.code == "model_cooling_down"
        assert refused.value.retry_after_s and refused.value.retry_after_s > 0
    await finish(queue, "b", ok=True)  # the same anonymous caller, another model: served
    assert queue_status(queue)["failing_models"][0]["model"] == "a"


async def test_queue_never_cools_down_for_client_faults(queue):
    for _ in range(queue.requestors.failure_threshold * 3):
        await finish(queue, "a", ok=False, client_fault=True)
    await finish(queue, "a", ok=True)


class Ticket:
    """What the relay releases, recorded."""

    def __init__(self) -> None:
        self.released: list[dict] = []
        self.figures = Figures()
        self.tokens: int | None = None  # what the answer said it generated

    def release(self, ok: bool = True, client_fault: bool = False) -> None:
        self.released.append({"ok": ok, "client_fault": client_fault})


async def test_a_client_that_leaves_a_stream_is_no_failure_of_the_model():
    from model_boss.services.served import relay

    async def chunks():
        for n in range(10):
            yield b"data: %d\n\n" % n

    ticket = Ticket()
    stream = relay(chunks(), ticket, "a")  # type: ignore[arg-type]
    assert await stream.__anext__() == b"data: 0\n\n"
    await stream.aclose()  # the client went away mid-stream
    assert ticket.released == [{"ok": False, "client_fault": True}]


async def test_a_worker_that_breaks_a_stream_is_a_failure_of_the_model():
    from model_boss.errors import WorkerCrashed
    from model_boss.services.served import relay

    async def chunks():
        yield b"data: 0\n\n"
        raise WorkerCrashed("worker for 'a' exited with -9")

    ticket = Ticket()
    out = [chunk async for chunk in relay(chunks(), ticket, "a")]  # type: ignore[arg-type]
    assert out[-1].startswith(b'data: {"error"') and out[-1].endswith(b"data: [DONE]\n\n")
    assert ticket.released == [{"ok": False, "client_fault": False}]


async def test_a_stream_whose_close_is_cancelled_still_gives_its_slot_back():
    from model_boss.services.served import relay

    class Slow:
        """An upstream whose close is slow (a worker that takes its time to hang up)."""

        def __aiter__(self):
            return self

        async def __anext__(self) -> bytes:
            return b"data: 0\n\n"

        async def aclose(self) -> None:
            await asyncio.sleep(30)

    ticket = Ticket()
    stream = relay(Slow(), ticket, "a")  # type: ignore[arg-type]
    await stream.__anext__()
    closing = asyncio.create_task(stream.aclose())  # the client went away ...
    await asyncio.sleep(0.05)
    closing.cancel()  # ... and its request's task was cancelled while the relay closed
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert ticket.released == [{"ok": False, "client_fault": True}]


@pytest.mark.parametrize("started", [False, True])
async def test_a_stream_dropped_unread_gives_its_slot_back(tmp_path, started: bool):
    """The client goes as the answer begins: the server drops the stream without reading it
    (or after one chunk, without closing it). The slot is free again and the worker's stream
    is closed, so the next request runs."""
    import gc

    from model_boss.services.extensions import Extensions
    from model_boss.services.serving import serve

    coord, log = coordinator(tmp_path, [manifest("a")], backend_kwargs={"streams": True})
    await coord.start()
    try:
        body = {"model": "a", "stream": True, "messages": [], "tag": "dropped"}
        served = await serve(coord, "/v1/chat/completions", body, Extensions())
        assert served.chunks is not None and coord.pool.slots["a"].active == 1
        if started:
            await served.chunks.__anext__()
        del served
        gc.collect()
        for _ in range(100):
            if coord.pool.slots["a"].active == 0 and ("closed", "a", "dropped") in log:
                break
            await asyncio.sleep(0.02)
        assert coord.pool.slots["a"].active == 0
        assert ("closed", "a", "dropped") in log
        again = await asyncio.wait_for(serve(coord, "/v1/chat/completions",
                                             {**body, "stream": False}, Extensions()), 5)
        assert again.status == 200
    finally:
        await coord.stop()
