"""A streaming request that waits on a model load: SSE comment lines while it waits.

Until the request has waited on a load in flight for ``load_comments_after_s`` it is an ordinary
:func:`serve`, so a bad request, a refusal or a quick load keeps its own status and headers.
From then on the answer has begun (200, ``text/event-stream``, ``x-model-boss-model`` naming
the model it waits on): the load's stages arrive as comment lines
(``: loading smollm2-135m stage=loading 45% 3.2s``), at least every :data:`KEEPALIVE_S` so
proxies keep the connection open (SSE clients skip comments), then the answer's own chunks.
A failure after that start is an SSE error event then ``[DONE]``, as any failure mid-stream.
A client that goes away cancels its request; its model's owner decides whether the load
goes on (another waiter wants it) or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from .cancel import Departure
from .extensions import Extensions
from .served import MODEL_HEADER, Dialect, Served, openai_stream_end
from .serving import discard, serve

if TYPE_CHECKING:
    from ..coordinator import Coordinator

KEEPALIVE_S = 2.0


async def serve_streaming(coord: Coordinator, endpoint: str, body: dict[str, Any],
                          ext: Extensions, *, disconnected: Departure | None = None,
                          dialect: Dialect | None = None) -> Served:
    """:func:`serve`, and for ``stream: true`` the comment lines above while a load runs."""
    if not body.get("stream"):
        return await serve(coord, endpoint, body, ext, disconnected=disconnected,
                           dialect=dialect)
    ext.request_id = ext.request_id or "req-" + uuid.uuid4().hex[:16]
    rid = ext.request_id
    feed = coord.events.subscribe()
    work = asyncio.ensure_future(serve(coord, endpoint, body, ext, disconnected=disconnected,
                                       dialect=dialect))
    after_s = coord.settings.load_comments_after_s  # a shorter load is as if none
    seen: tuple[str, float] | None = None  # the model it waits on a load of, since when
    try:
        while True:
            model, line = loading_line(coord, rid)
            if model is None:
                seen = None
            elif seen is None or seen[0] != model:
                seen = (model, time.monotonic())
            if seen is not None and time.monotonic() - seen[1] >= after_s:
                break
            await _next_news(work, feed, after_s if seen else KEEPALIVE_S)
            if work.done():
                coord.events.unsubscribe(feed)
                return work.result()
    except BaseException:
        coord.events.unsubscribe(feed)
        await _cancel(work)
        raise
    assert line is not None and model is not None
    started: list[bool] = []
    chunks = _comments_then(coord, work, feed, rid, line, started,
                            dialect.stream_end if dialect else openai_stream_end)
    # a stream dropped before its first chunk (the client went as the answer began) runs no
    # clean-up of its own: then the request is cancelled when the stream is collected
    weakref.finalize(chunks, _never_streamed, coord, work, feed, started).atexit = False
    return Served(200, {MODEL_HEADER: model}, "text/event-stream", chunks=chunks)


def _never_streamed(coord: Coordinator, work: asyncio.Future, feed: asyncio.Queue,
                    started: list[bool]) -> None:
    if started:
        return
    coord.events.unsubscribe(feed)
    if not work.done():
        work.cancel()  # leaves the queue; an answer not yet begun is never asked for
    elif not work.cancelled() and work.exception() is None and work.result().chunks:
        coord.pool.spawn(discard(work.result().chunks))


def loading_line(coord: Coordinator, request_id: str) -> tuple[str | None, bytes | None]:
    """The model a waiting request waits on a load of, and the comment that says how far
    that load is; (None, None) when it waits on no load."""
    request = next((r for r in coord.queue.ordered() if r.request_id == request_id), None)
    owner = coord.pool.owners.get(request.model_id) if request is not None else None
    progress = owner.progress if owner is not None else None
    if request is None or progress is None:
        return None, None
    snap = progress.snapshot()
    fraction = f" {snap['fraction']:.0%}" if snap["fraction"] is not None else ""
    return request.model_id, (f": loading {request.model_id} stage={snap['stage']}{fraction} "
                              f"{snap['elapsed_s']:.1f}s\n\n").encode()


def _waiting_line(coord: Coordinator, request_id: str) -> bytes | None:
    """Loaded, but still in line (others ahead): where it stands."""
    for position, request in enumerate(coord.queue.ordered(), 1):
        if request.request_id == request_id:
            return f": waiting for {request.model_id} position={position}\n\n".encode()
    return None


async def _comments_then(coord: Coordinator, work: asyncio.Future, feed: asyncio.Queue,
                         rid: str, first: bytes, started: list[bool],
                         end: Callable[[Exception], bytes]) -> AsyncIterator[bytes]:
    started.append(True)
    served: Served | None = None
    try:
        yield first
        while not work.done():
            event = await _next_news(work, feed)
            if work.done():
                break
            if event is None or event["type"] == "load_progress":  # a tick, or news
                line = loading_line(coord, rid)[1] or _waiting_line(coord, rid)
                if line is not None:
                    yield line
        try:
            served = work.result()
        except Exception as exc:
            yield end(exc)
            return
        if served.chunks is None:
            yield served.body
            return
        async for chunk in served.chunks:
            yield chunk
    finally:
        coord.events.unsubscribe(feed)
        await _cancel(work)
        if served is None and work.done() and not work.cancelled() \
                and work.exception() is None:
            served = work.result()  # answered as the client went: release its slot
        if served is not None and served.chunks is not None:
            await discard(served.chunks)


async def _next_news(work: asyncio.Future, feed: asyncio.Queue,
                     timeout_s: float = KEEPALIVE_S) -> dict | None:
    """Wait for the work to end, an event, or a tick (None)."""
    news = asyncio.ensure_future(feed.get())
    try:
        done, _ = await asyncio.wait({work, news}, timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        news.cancel()
    return news.result() if news in done else None


async def _cancel(work: asyncio.Future) -> None:
    if not work.done():
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
