"""A Messages stream that opens at once and keeps talking, as Anthropic's does: its
``message_start`` goes out before the request has waited in the queue, loaded its model or had
its prompt read, then a ``ping`` every :func:`ping_interval_s` while nothing else comes (with
the load's ``: loading ...`` comment while one runs), then the answer's own events.

Claude Code gives up on a stream that says nothing for a while ("no chunks received"), and a
long prompt on a local model takes minutes to read. What fails before :data:`START_GRACE_S`
(an unknown model, a bad body, a full queue, a prompt too long for a loaded model) keeps its
own status; a failure after the stream opened is its ``error`` event. The worker's own
``message_start`` and pings are dropped (one of each per stream), the usage they carried is
in ``message_delta`` (:func:`.answers.tell_events`). This is what a Messages stream says; its
life (the request cancelled and its slot given back on any exit) is :mod:`..stream_life`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ...backends.sse import sse_events
from ..load_wait import loading_line
from ..served import MODEL_HEADER, Chunks
from ..stream_life import Work
from .answers import event
from .stream import PING, error_event, message_start

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


class MessagesVoice:
    """A Messages stream's :class:`~..stream_life.Voice`: it opens within
    :data:`START_GRACE_S` with ``message_start`` and a ping (``model`` names the model until
    the answer names its own), pings every :func:`ping_interval_s` (after the load's comment
    while one runs) until the answer and through its silences, and ends a failure with its
    ``error`` event."""

    def __init__(self, coord: Coordinator, model: str, request_id: str) -> None:
        self.coord = coord
        self.model = model
        self.request_id = request_id
        self.interval = ping_interval_s()

    async def until_open(self, work: Work) -> dict[str, str]:
        await asyncio.wait({work}, timeout=START_GRACE_S)
        if not work.done():
            return {MODEL_HEADER: self.model}
        served = work.result()  # a quick failure: its own status
        self.model = served.headers.get(MODEL_HEADER, self.model)
        return served.headers

    def opening(self) -> Sequence[bytes]:
        return message_start(self.model), PING

    async def beat(self, work: Work) -> Sequence[bytes]:
        await asyncio.wait({work}, timeout=self.interval)
        line = loading_line(self.coord, self.request_id)[1]
        return (PING,) if line is None else (line, PING)

    def failed(self, exc: Exception) -> bytes:
        return error_event(exc)

    def whole(self, body: bytes) -> Sequence[bytes]:
        return message_events(body)

    def answer(self, chunks: Chunks) -> Chunks:
        return _pinged(sse_events(chunks), self.interval)

    def close(self) -> None:
        pass


async def _pinged(events: Chunks, interval: float) -> Chunks:
    """``events`` as they come, but the worker's own ``message_start`` and pings; a ping
    each time ``interval`` passes without one."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield PING
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            if not item.startswith(_DROPPED):
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
