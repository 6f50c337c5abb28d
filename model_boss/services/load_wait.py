"""A streaming request that waits on a model load: SSE comment lines while it waits.

Until the request has waited on a load in flight for ``load_comments_after_s`` it is an ordinary
:func:`serve`, so a bad request, a refusal or a quick load keeps its own status and headers.
From then on the answer has begun (200, ``text/event-stream``, ``x-model-boss-model`` naming
the model it waits on): the load's stages arrive as comment lines
(``: loading smollm2-135m stage=loading 45% 3.2s``), at least every :data:`KEEPALIVE_S` so
proxies keep the connection open (SSE clients skip comments), then the answer's own chunks.
A failure after that start is an SSE error event then ``[DONE]``, as any failure mid-stream.
A client that goes away cancels its request; its model's owner decides whether the load
goes on (another waiter wants it) or is cancelled. This is what an OpenAI stream says; its
life (the request cancelled and its slot given back on any exit) is :mod:`.stream_life`'s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .cancel import Departure
from .extensions import Extensions
from .served import MODEL_HEADER, Chunks, Dialect, Served, StreamEnd, openai_stream_end
from .serving import serve
from .stream_life import Work, open_early

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
    voice = OpenAIVoice(coord, ext.request_id,
                        dialect.stream_end if dialect else openai_stream_end)
    return await open_early(coord, serve(coord, endpoint, body, ext, disconnected=disconnected,
                                         dialect=dialect), voice)


class OpenAIVoice:
    """An OpenAI stream's :class:`~.stream_life.Voice`: it opens once a load has kept the
    request waiting ``load_comments_after_s``, says the load's stages (then its place in
    line) as SSE comments on news or every :data:`KEEPALIVE_S`, passes the answer as it
    comes, and ends a failure with ``end`` (the route's error event then ``[DONE]``)."""

    def __init__(self, coord: Coordinator, request_id: str, end: StreamEnd) -> None:
        self.coord = coord
        self.request_id = request_id
        self.end = end
        self.feed = coord.events.subscribe()  # load progress: news to pass on at once
        self.first = b""

    async def until_open(self, work: Work) -> dict[str, str] | None:
        after_s = self.coord.settings.load_comments_after_s  # a shorter load is as if none
        seen: tuple[str, float] | None = None  # the model it waits on a load of, since when
        while True:
            model, line = loading_line(self.coord, self.request_id)
            if model is None:
                seen = None
            elif seen is None or seen[0] != model:
                seen = (model, time.monotonic())
            if seen is not None and time.monotonic() - seen[1] >= after_s:
                assert model is not None and line is not None
                self.first = line
                return {MODEL_HEADER: model}
            await _next_news(work, self.feed, after_s if seen else KEEPALIVE_S)
            if work.done():
                return None

    def opening(self) -> Sequence[bytes]:
        return (self.first,)

    async def beat(self, work: Work) -> Sequence[bytes]:
        event = await _next_news(work, self.feed)
        if event is None or event["type"] == "load_progress":  # a tick, or news
            line = loading_line(self.coord, self.request_id)[1] \
                or _waiting_line(self.coord, self.request_id)
            if line is not None:
                return (line,)
        return ()

    def failed(self, exc: Exception) -> bytes:
        return self.end(exc)

    def whole(self, body: bytes) -> Sequence[bytes]:
        return (body,)

    def answer(self, chunks: Chunks) -> Chunks:
        return chunks

    def close(self) -> None:
        self.coord.events.unsubscribe(self.feed)


def loading_line(coord: Coordinator, request_id: str) -> tuple[str | None, bytes | None]:
    """The model a waiting request waits on a load of, and the comment that says how far
    that load is; (None, None) when it waits on no load."""
    request = next((r for r in coord.queue.ordered() if r.request_id == request_id), None)
    owners = coord.pool.replicas(request.model_id) if request is not None else []
    # the load of any copy of its model (its first, or one more for its waiters)
    progress = next((o.progress for o in owners if o.progress is not None), None)
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
