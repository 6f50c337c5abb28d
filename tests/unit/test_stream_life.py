"""A stream's life (model_boss/services/stream_life.py): opened before its answer, it gives
back exactly once what its request holds, however it ends. Before its slot is granted a request
holds its place in the queue (given back when its serving is cancelled or fails); after, its
slot (the ticket the relay releases). The voice lets go of what its wait held exactly once."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from model_boss.errors import LoadFailed, WorkerCrashed
from model_boss.scheduling.request import QueuedRequest, SlotTicket
from model_boss.services.served import Served, openai_stream_end
from model_boss.services.stream_life import Work, open_early, slot_stream

ANSWER = [b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"]
DONE = b"data: [DONE]\n\n"


class Pool:
    """The coordinator's pool as the life uses it: it owns the clean-ups it is handed."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        return task


class Voice:
    """A voice that says where the stream is: ``open``, a ``beat`` per wait (one beat lasts
    until the answer, or ``beat_s``), ``failed`` for a failure after it opened. One that
    does not ``open_early`` waits for the answer (a model loaded already)."""

    def __init__(self, open_early: bool, beat_s: float) -> None:
        self.open_early = open_early
        self.beat_s = beat_s
        self.closed = 0

    async def until_open(self, work: Work) -> dict[str, str] | None:
        if not self.open_early:
            await asyncio.wait({work})
            return None
        await asyncio.wait({work}, timeout=0.01)  # a grace: the request reaches the queue
        return {"x-model-boss-model": "m"}

    def opening(self) -> Sequence[bytes]:
        return (b": open\n\n",)

    async def beat(self, work: Work) -> Sequence[bytes]:
        await asyncio.wait({work}, timeout=self.beat_s)
        return (b": beat\n\n",)

    def failed(self, exc: Exception) -> bytes:
        return b"failed: " + str(exc).encode()

    def whole(self, body: bytes) -> Sequence[bytes]:
        return (body,)

    def answer(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return chunks

    def close(self) -> None:
        self.closed += 1


class Request:
    """One request's serving: it waits for ``load`` (its turn and its model's load), then
    is granted the slot whose worker streams ``upstream``. ``gave_back`` is what it gave
    back: its queue place, or its slot with how the slot's stream ended (ok, client's fault)."""

    def __init__(self, pool: Pool, upstream: Callable[[], AsyncIterator[bytes]]) -> None:
        self.coord = SimpleNamespace(pool=pool)
        self.load: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.upstream = upstream
        self.gave_back: list[tuple] = []

    def loaded(self) -> None:
        if not self.load.done():
            self.load.set_result(None)

    async def serve(self) -> Served:
        try:
            await self.load
        except BaseException:  # cancelled or failed in the queue: never granted
            self.gave_back.append(("queue",))
            raise
        ticket = SlotTicket(lambda _, ok, fault: self.gave_back.append(("slot", ok, fault)),
                            QueuedRequest(model_id="m", priority=5),
                            SimpleNamespace(loaded_at=None, key="m", model_id="m"))
        chunks = slot_stream(self.coord, self.upstream(), ticket, "m",  # type: ignore[arg-type]
                             openai_stream_end)
        return Served(200, {}, "text/event-stream", chunks=chunks)


async def answers() -> AsyncIterator[bytes]:
    for chunk in ANSWER:
        yield chunk


async def breaks() -> AsyncIterator[bytes]:
    yield ANSWER[0]
    raise WorkerCrashed("worker for 'm' exited with -9")


async def stalls() -> AsyncIterator[bytes]:
    yield ANSWER[0]
    await asyncio.sleep(3600)  # a token that takes its time
    yield ANSWER[1]


async def settled(pool: Pool) -> None:
    """Let what was cancelled, failed or spawned run its course."""
    for _ in range(5):
        await asyncio.sleep(0.01)
        if pool.tasks:  # bounded: a clean-up that hangs shows as what was not given back
            await asyncio.wait(pool.tasks, timeout=1)


# what the client does with the stream, given the request it opened for; it returns what it read
Client = Callable[[AsyncIterator[bytes], Request], Awaitable[list[bytes]]]


async def reads_to_the_end(stream: AsyncIterator[bytes], request: Request) -> list[bytes]:
    said = [await anext(stream)]
    request.loaded()
    return said + [piece async for piece in stream]


async def closes_while_waiting(stream: AsyncIterator[bytes], request: Request) -> list[bytes]:
    said = [await anext(stream), await anext(stream)]  # opened, then one beat
    await stream.aclose()  # type: ignore[attr-defined]
    return said


async def is_cancelled_while_waiting(stream: AsyncIterator[bytes],
                                     request: Request) -> list[bytes]:
    said = [await anext(stream)]
    reading = asyncio.ensure_future(anext(stream))  # waits on a beat that lasts
    await asyncio.sleep(0.02)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    return said


async def reads_until_the_answer(stream: AsyncIterator[bytes],
                                 request: Request) -> list[bytes]:
    said = [await anext(stream)]
    request.loaded()
    while not said[-1].startswith(b"data:"):  # beats until the answer's first chunk
        said.append(await anext(stream))
    return said


async def closes_mid_answer(stream: AsyncIterator[bytes], request: Request) -> list[bytes]:
    said = await reads_until_the_answer(stream, request)
    await stream.aclose()  # type: ignore[attr-defined]
    return said


async def is_cancelled_mid_answer(stream: AsyncIterator[bytes],
                                  request: Request) -> list[bytes]:
    said = await reads_until_the_answer(stream, request)
    reading = asyncio.ensure_future(anext(stream))  # waits on the worker's next token
    await asyncio.sleep(0.02)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    return said


async def sees_the_load_fail(stream: AsyncIterator[bytes], request: Request) -> list[bytes]:
    said = [await anext(stream)]
    request.load.set_exception(LoadFailed("weights are corrupt"))
    return said + [piece async for piece in stream]


async def drops_it_while_waiting(stream: AsyncIterator[bytes], request: Request) -> list[bytes]:
    return []  # never read: the server dropped it as the client went


async def drops_it_answered(stream: AsyncIterator[bytes], request: Request) -> list[bytes]:
    request.loaded()
    await asyncio.sleep(0.01)  # served: the slot is granted, its stream not yet read
    return []


@dataclass(frozen=True)
class Exit:
    client: Client
    upstream: Callable[[], AsyncIterator[bytes]]
    gave_back: tuple  # exactly what the request gives back, once
    last: bytes | None  # the stream's last bytes, where the client read to its end
    open_early: bool = True  # False: the answer came first (its slot's stream goes as is)


EXITS = {
    "normal end": Exit(reads_to_the_end, answers, ("slot", True, False), DONE),
    "client closes while it waits": Exit(closes_while_waiting, answers, ("queue",), None),
    "client cancelled while it waits": Exit(is_cancelled_while_waiting, answers, ("queue",),
                                            None),
    "client closes mid-answer": Exit(closes_mid_answer, stalls, ("slot", False, True), None),
    "client cancelled mid-answer": Exit(is_cancelled_mid_answer, stalls,
                                        ("slot", False, True), None),
    "worker fails mid-answer": Exit(reads_to_the_end, breaks, ("slot", False, False), DONE),
    "load fails after it opened": Exit(sees_the_load_fail, answers, ("queue",),
                                       b"failed: weights are corrupt"),
    "dropped unread while it waits": Exit(drops_it_while_waiting, answers, ("queue",), None),
    "dropped unread once answered": Exit(drops_it_answered, answers, ("slot", False, True),
                                         None),
    "answered before it opened, read": Exit(reads_to_the_end, answers, ("slot", True, False),
                                            DONE, open_early=False),
    "answered before it opened, dropped unread": Exit(
        drops_it_while_waiting, answers, ("slot", False, True), None, open_early=False),
}


@pytest.mark.parametrize("exit_", EXITS.values(), ids=EXITS.keys())
async def test_every_exit_gives_back_what_the_request_holds_exactly_once(exit_: Exit) -> None:
    pool = Pool()
    request = Request(pool, exit_.upstream)
    voice = Voice(exit_.open_early,
                  beat_s=0.01 if exit_.client is not is_cancelled_while_waiting else 3600)
    if not exit_.open_early:
        request.loaded()
    served = await open_early(request.coord, request.serve(), voice)  # type: ignore[arg-type]
    assert served.status == 200 and served.chunks is not None
    began = time.monotonic()
    said = await asyncio.wait_for(exit_.client(served.chunks, request), 5)
    assert time.monotonic() - began < 2.5  # no exit waits on the worker's next token
    if exit_.last is not None:
        assert said[-1].endswith(exit_.last), said
    if exit_.client not in (drops_it_while_waiting, drops_it_answered):
        await settled(pool)  # a stream that ran gives back as it ends, not when collected
        assert request.gave_back == [exit_.gave_back]
    del served, said
    gc.collect()  # a stream never read is given back when it is collected
    await settled(pool)
    assert request.gave_back == [exit_.gave_back]
    assert voice.closed == 1
