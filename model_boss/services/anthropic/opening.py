"""A Messages stream that opens at once and keeps talking, as Anthropic's does: its
``message_start`` goes out before the request has waited in the queue, loaded its model or had
its prompt read, then a ``ping`` every :func:`ping_interval_s` while nothing else comes (with
the load's ``: loading ...`` comment while one runs), then the answer's own events.

Claude Code gives up on a stream that says nothing for a while ("no chunks received"), and a
long prompt on a local model takes minutes to read. What fails before :data:`START_GRACE_S`
(an unknown model, a bad body, a full queue, a prompt too long for a loaded model) keeps its
own status; a failure after the stream opened is its ``error`` event. The worker's own
``message_start`` and pings are dropped (one of each per stream), the usage they carried is
in ``message_delta`` (:func:`.answers.tell_events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from ...backends.sse import sse_events
from ..load_wait import loading_line
from ..served import MODEL_HEADER, Served, discard
from .answers import event
from .stream import PING, message_start

if TYPE_CHECKING:
    from ...coordinator import Coordinator

log = logging.getLogger(__name__)

# how long a stream waits for its answer before it opens: failures this quick keep their status
START_GRACE_S = 0.25
PING_INTERVAL_S = 5.0  # Anthropic's server pings about this often
PING_ENV = "MODEL_BOSS_ANTHROPIC_PING_S"  # another interval (seconds, 0.05 to 60)
_PING_RANGE = (0.05, 60.0)
_DROPPED = (b"event: message_start", b"event: ping")


def ping_interval_s() -> float:
    """:data:`PING_INTERVAL_S`, or the interval :data:`PING_ENV` sets."""
    given = os.environ.get(PING_ENV)
    if not given:
        return PING_INTERVAL_S
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if not _PING_RANGE[0] <= value <= _PING_RANGE[1]:
        log.warning("%s=%r is not a number of seconds from %g to %g; pinging every %gs",
                    PING_ENV, given, *_PING_RANGE, PING_INTERVAL_S)
        return PING_INTERVAL_S
    return value


async def open_stream(coord: Coordinator, start: Awaitable[Served], model: str,
                      request_id: str, tell_error: Callable[[BaseException], bytes]) -> Served:
    """Serve ``start`` (the request's serving) as a stream that opens within
    :data:`START_GRACE_S`; ``model`` names the model until the answer names its own."""
    work = asyncio.ensure_future(start)
    try:
        await asyncio.wait({work}, timeout=START_GRACE_S)
    except BaseException:
        await _cancel(work)
        raise
    headers = {MODEL_HEADER: model}
    if work.done():
        served = work.result()  # a quick failure: its own status
        headers = served.headers
        model = served.headers.get(MODEL_HEADER, model)
    began: list[bool] = []
    chunks = _events(coord, work, model, request_id, began, tell_error)
    # a stream dropped before its first event (the client went) runs no clean-up of its own
    weakref.finalize(chunks, _never_streamed, coord, work, began).atexit = False
    return Served(200, headers, "text/event-stream", chunks=chunks)


async def _events(coord: Coordinator, work: asyncio.Future, model: str, request_id: str,
                  began: list[bool], tell_error: Callable[[BaseException], bytes],
                  ) -> AsyncIterator[bytes]:
    began.append(True)
    interval = ping_interval_s()
    served: Served | None = None
    read = False  # whether the answer's chunks were started
    try:
        yield message_start(model)
        yield PING
        while not work.done():
            await asyncio.wait({work}, timeout=interval)
            if not work.done():
                line = loading_line(coord, request_id)[1]
                if line is not None:
                    yield line
                yield PING
        try:
            served = work.result()
        except Exception as exc:
            yield tell_error(exc)
            return
        if served.chunks is None:  # a worker that answered whole all the same
            for one in message_events(served.body):
                yield one
            return
        read = True
        async for whole in _pinged(sse_events(served.chunks), interval):
            if whole is None:
                yield PING
            elif not whole.startswith(_DROPPED):
                yield whole
    finally:
        await _cancel(work)
        if served is None and work.done() and not work.cancelled() \
                and work.exception() is None:
            served = work.result()  # answered as the client went: give its slot back
        if served is not None and served.chunks is not None:
            if read:
                with contextlib.suppress(Exception):
                    await served.chunks.aclose()  # type: ignore[attr-defined]
            else:
                await discard(served.chunks)


async def _pinged(events: AsyncIterator[bytes], interval: float,
                  ) -> AsyncIterator[bytes | None]:
    """``events`` as they come, and None each time ``interval`` passes without one."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(Exception):
            await events.aclose()  # type: ignore[attr-defined]


def message_events(body: bytes) -> list[bytes]:
    """A whole message (or an error body) as the events after ``message_start``."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        message = None
    if not isinstance(message, dict) or message.get("type") != "message":
        error = (message or {}).get("error") if isinstance(message, dict) else None
        text = error.get("message") if isinstance(error, dict) else None
        return [event("error", {"error": {"type": "api_error",
                                          "message": text or "the worker's answer was not "
                                                             "a message"}})]
    out: list[bytes] = []
    for index, block in enumerate(message.get("content") or []):
        out.append(event("content_block_start", {"index": index,
                                                 "content_block": _opening(block)}))
        delta = _whole_delta(block)
        if delta is not None:
            out.append(event("content_block_delta", {"index": index, "delta": delta}))
        out.append(event("content_block_stop", {"index": index}))
    out.append(event("message_delta", {
        "delta": {"stop_reason": message.get("stop_reason"),
                  "stop_sequence": message.get("stop_sequence")},
        "usage": message.get("usage") or {"output_tokens": 0}}))
    out.append(event("message_stop", {}))
    return out


def _opening(block: dict[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": ""}
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": block.get("signature", "")}
    if kind == "tool_use":
        return {**block, "input": {}}
    return block


def _whole_delta(block: dict[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text" and block.get("text"):
        return {"type": "text_delta", "text": block["text"]}
    if kind == "thinking" and block.get("thinking"):
        return {"type": "thinking_delta", "thinking": block["thinking"]}
    if kind == "tool_use":
        return {"type": "input_json_delta",
                "partial_json": orjson.dumps(block.get("input") or {}).decode()}
    return None


def _never_streamed(coord: Coordinator, work: asyncio.Future, began: list[bool]) -> None:
    if began:
        return
    if not work.done():
        work.cancel()  # leaves the queue; an answer not yet begun is never asked for
    elif not work.cancelled() and work.exception() is None and work.result().chunks:
        coord.pool.spawn(discard(work.result().chunks))


async def _cancel(work: asyncio.Future) -> None:
    if not work.done():
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
