"""A stream's life, declared once for every API that streams: opened early, kept alive while
it waits, and what its request holds given back on any exit.

A streaming answer may open before it is served (:func:`open_early`): its 200 and headers go
out while the request waits in the queue or on a load, so a client that gives up on a silent
connection stays (Claude Code's "no chunks received", a proxy that drops an idle one). What
differs between APIs is its :class:`Voice`: when it opens, its first bytes, its keep-alive, the
ending of a failure after it opened, a whole answer told as events, the answer's own chunks.
What is the same is here: on every exit (the answer's end, a client that goes while it waits
or mid-answer, a failure, a stream dropped before it ever ran) the request is cancelled and
the answer's chunks are closed, which gives its slot back (:func:`slot_stream`).

An Ollama stream never opens early: NDJSON has no line its clients skip, and a failure before
its answer keeps its own status. Its slot is given back by the same :func:`slot_stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .served import Chunks, Served, StreamEnd, discard, relay

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..scheduling.request import SlotTicket

Work = asyncio.Future[Served]  # a request's serving, under way
CleanUp = Coroutine[Any, Any, None]


class Voice(Protocol):
    """What one API says on a stream that opens early. One voice a request: it may keep
    what it learnt while waiting, and hold what :meth:`close` lets go."""

    async def until_open(self, work: Work) -> dict[str, str] | None:
        """Wait until the stream must open and return its headers; None when ``work``
        ended first (its answer goes as served, a failure with its own status)."""
        ...

    def opening(self) -> Sequence[bytes]:
        """The bytes the stream opens with."""
        ...

    async def beat(self, work: Work) -> Sequence[bytes]:
        """Wait one beat (or until ``work`` ends) and say what keeps the client waiting."""
        ...

    def failed(self, exc: Exception) -> bytes:
        """The ending of a stream whose request failed after it opened."""
        ...

    def whole(self, body: bytes) -> Sequence[bytes]:
        """A whole answer (from a worker that answered whole all the same), as events."""
        ...

    def answer(self, chunks: Chunks) -> Chunks:
        """The answer's own chunks as the client gets them."""
        ...

    def close(self) -> None:
        """Let go of what the wait held; called once the stream ended, or never ran."""
        ...


async def open_early(coord: Coordinator, start: Awaitable[Served], voice: Voice) -> Served:
    """Serve ``start`` (the request's serving) as a stream that opens when ``voice`` says,
    before the answer is there; an answer that came first goes as served."""
    work: Work = asyncio.ensure_future(start)
    try:
        headers = await voice.until_open(work)
    except BaseException:
        voice.close()
        await _cancel(work)
        raise
    if headers is None:
        voice.close()
        return work.result()
    stream = _EarlyStream(work, voice)
    chunks = stream.chunks()
    when_dropped(coord, chunks, stream.dropped)
    return Served(200, headers, "text/event-stream", chunks=chunks)


def slot_stream(coord: Coordinator, chunks: Chunks, ticket: SlotTicket, model_id: str,
                end: StreamEnd) -> Chunks:
    """A worker's ``chunks`` relayed (:func:`.served.relay`), its slot given back however
    the stream ends. One never started is closed before its slot goes, so the next request
    does not find the worker still answering."""
    async def close_then_release() -> None:
        try:
            await discard(chunks)
        finally:
            ticket.release(ok=False, client_fault=True)

    relayed = relay(chunks, ticket, model_id, end)
    when_dropped(coord, relayed, close_then_release,
                 at_shutdown=lambda: ticket.release(ok=False, client_fault=True))
    return relayed


def when_dropped(coord: Coordinator, stream: Chunks, clean_up: Callable[[], CleanUp | None],
                 at_shutdown: Callable[[], None] = lambda: None) -> None:
    """Call ``clean_up`` once ``stream`` is collected, and run what it returns as a task the
    pool owns (``at_shutdown`` instead where no loop runs). A stream the server never started
    (the client went as its answer began) runs no ``finally`` of its own."""
    weakref.finalize(stream, _dropped, coord, clean_up, at_shutdown).atexit = False


def _dropped(coord: Coordinator, clean_up: Callable[[], CleanUp | None],
             at_shutdown: Callable[[], None]) -> None:
    closing = clean_up()
    if closing is None:
        return
    try:
        coord.pool.spawn(closing)
    except RuntimeError:  # no running loop (shutting down): what it holds goes with it
        closing.close()
        at_shutdown()


class _EarlyStream:
    """One stream opened before its answer: the request's work, its voice, whether it ran."""

    def __init__(self, work: Work, voice: Voice) -> None:
        self.work = work
        self.voice = voice
        self.ran = False

    async def chunks(self) -> Chunks:
        self.ran = True
        work, voice = self.work, self.voice
        served: Served | None = None
        answer: Chunks | None = None  # the voice's reading of the answer, once begun
        try:
            for piece in voice.opening():
                yield piece
            while not work.done():
                said = await voice.beat(work)
                if work.done():
                    break
                for piece in said:
                    yield piece
            try:
                served = work.result()
            except Exception as exc:
                yield voice.failed(exc)
                return
            if served.chunks is None:
                for piece in voice.whole(served.body):
                    yield piece
                return
            answer = voice.answer(served.chunks)
            async for piece in answer:
                yield piece
        finally:
            voice.close()
            await _cancel(work)
            if served is None and _answered(work):
                served = work.result()  # answered as the client went: its slot goes back
            if answer is not None:
                await _close(answer)  # first: it may be reading the chunks
            if served is not None and served.chunks is not None:
                await (_close(served.chunks) if answer is not None
                       else discard(served.chunks))

    def dropped(self) -> CleanUp | None:
        """What a stream collected before it ran leaves to do: the request leaves the queue
        (an answer not yet begun is never asked for), or its answer is closed unread."""
        if self.ran:
            return None
        self.voice.close()
        if not self.work.done():
            self.work.cancel()
        elif _answered(self.work) and self.work.result().chunks is not None:
            return discard(self.work.result().chunks)
        return None


def _answered(work: Work) -> bool:
    return work.done() and not work.cancelled() and work.exception() is None


async def _cancel(work: Work) -> None:
    if not work.done():
        work.cancel()
        with contextlib.suppress(BaseException):
            await work


async def _close(chunks: Chunks) -> None:
    with contextlib.suppress(Exception):
        await chunks.aclose()  # type: ignore[attr-defined]
