"""Anthropic's streaming protocol: a chat-completions stream told as Messages events
(message_start, ping, content_block_start/delta/stop, message_delta, message_stop), a
worker's own Messages stream with its ping added, and the ``error`` event that ends a stream
that failed after it began."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ...backends.sse import sse_data, sse_events
from ...errors import ModelBossError
from ..redact import redacted
from .translate import matched_stop, message_id, message_usage, stop_reason, tool_use_id

# HTTP status → Anthropic's error type; another 4xx is invalid_request_error, another 5xx
# api_error. Anthropic has no 409: a state that forbids the request (model_busy,
# model_not_loaded) is the client's to wait out or change, so invalid_request_error
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               409: "invalid_request_error", 413: "request_too_large",
               422: "invalid_request_error", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error envelope."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500
                           else "api_error")  # api_error never for what the client can fix
    return {"type": "error", "error": {"type": kind, "message": message}}


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) \
        + b"\n\n"


def error_event(exc: Exception) -> bytes:
    """The ``error`` event that ends a stream which failed after it began."""
    if not isinstance(exc, ModelBossError):
        exc = ModelBossError(f"stream failed: {exc}", code="stream_failed")
    body = error_body(exc.status_code, redacted(exc).message)
    return event("error", {"error": body["error"]})


PING = event("ping", {})


def message_start(model_id: str) -> bytes:
    return event("message_start", {"message": {
        "id": message_id(), "type": "message", "role": "assistant", "model": model_id,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}})


async def native(chunks: AsyncIterator[bytes], model_id: str) -> AsyncIterator[bytes]:
    """A worker's own Messages stream, with a ``ping`` after its ``message_start`` (as
    Anthropic's server sends one). llama.cpp's server leaves ``message_start`` out when its
    first token is part of a multi-byte character (an emoji): one is sent in its place, as
    a client cannot read a stream without it."""
    first = True
    try:
        async for whole in sse_events(chunks):
            if first and not whole.startswith(b":"):
                first = False
                if not whole.startswith(b"event: message_start"):
                    yield message_start(model_id)
                    yield PING
                    yield whole
                    continue
                yield whole
                yield PING
                continue
            yield whole
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]


class StreamFailed(ModelBossError):
    """The worker reported a failure inside its stream."""

    status_code = 502
    code = "upstream_error"


class _Blocks:
    """The content blocks of one answer as they open and close."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.tools: dict[int, int] = {}  # the chunk's tool-call index → our block index

    def open(self, kind: str, start: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        out.append(event("content_block_start", {"index": self.index, "content_block": start}))
        return out

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"index": self.index})]

    def delta(self, kind: str, start: dict[str, Any], delta: dict[str, Any]) -> list[bytes]:
        out = self.open(kind, start) if self.kind != kind else []
        out.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        return out


class _HeldText:
    """A streamed text less the tail that could still turn out to be a stop sequence (a
    server that keeps the stop string in the text): held until the next text or the end."""

    def __init__(self, stops: list[str] | None) -> None:
        self.stops = [stop for stop in stops or [] if stop]
        self.held = ""
        self.text = ""  # all of it, for the stop sequence the answer ends with

    def add(self, text: str) -> str:
        self.text += text
        self.held += text
        keep = max((n for stop in self.stops for n in range(1, len(stop) + 1)
                    if self.held.endswith(stop[:n])), default=0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self, stop: str | None = None) -> str:
        out, self.held = self.held, ""
        return out[:-len(stop)] if stop and out.endswith(stop) else out


async def from_chat_stream(chunks: AsyncIterator[bytes], model_id: str,
                           stops: list[str] | None = None) -> AsyncIterator[bytes]:
    """A chat-completions stream (``data: {...}`` chunks, ``data: [DONE]``) as Messages
    events. A worker's error chunk ends it with an ``error`` event. ``stops``: the request's
    ``stop_sequences``, the one that ended the answer reported as ``stop_sequence``
    (:func:`~.translate.matched_stop`)."""
    blocks = _Blocks()
    finish: str | None = None
    usage: dict[str, Any] = {}
    saw_tool = False
    text = _HeldText(stops)
    last: dict[str, Any] = {}  # the last choice, with the stop string a server may name
    yield message_start(model_id)
    yield PING
    try:
        async for whole in sse_events(chunks):
            data = sse_data(whole)
            if data is None or data == b"[DONE]":
                continue
            chunk = orjson.loads(data)
            if isinstance(chunk.get("error"), dict):
                raise StreamFailed(str(chunk["error"].get("message") or "the worker failed"))
            if chunk.get("usage"):
                usage = message_usage(chunk["usage"], chunk)
            for choice in (chunk.get("choices") or [])[:1]:
                last = {**last, **choice}
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content") or delta.get("tool_calls"):
                    for out in _text_delta(blocks, text.flush()):
                        yield out
                if delta.get("reasoning_content"):
                    for out in blocks.delta("thinking", {"type": "thinking", "thinking": "",
                                                         "signature": ""},
                                            {"type": "thinking_delta",
                                             "thinking": delta["reasoning_content"]}):
                        yield out
                if isinstance(delta.get("content"), str):
                    for out in _text_delta(blocks, text.add(delta["content"])):
                        yield out
                for call in delta.get("tool_calls") or []:
                    saw_tool = True
                    for out in _tool_delta(blocks, call):
                        yield out
                finish = choice.get("finish_reason") or finish
        stop = None if saw_tool else matched_stop({**last, "finish_reason": finish},
                                                  text.text, stops)
        for out in _text_delta(blocks, text.flush(stop)):
            yield out
        for out in blocks.close():
            yield out
        reason = "tool_use" if saw_tool else "stop_sequence" if stop else stop_reason(finish)
        yield event("message_delta", {
            "delta": {"stop_reason": reason, "stop_sequence": stop},
            "usage": usage or {"input_tokens": 0, "output_tokens": 0}})
        yield event("message_stop", {})
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]


def _text_delta(blocks: _Blocks, text: str) -> list[bytes]:
    if not text:
        return []
    return blocks.delta("text", {"type": "text", "text": ""},
                        {"type": "text_delta", "text": text})


def _tool_delta(blocks: _Blocks, call: dict[str, Any]) -> list[bytes]:
    out: list[bytes] = []
    position = int(call.get("index", 0))
    function = call.get("function") or {}
    if position not in blocks.tools:
        out += blocks.open("tool_use", {"type": "tool_use", "id": call.get("id") or tool_use_id(),
                                        "name": function.get("name", ""), "input": {}})
        blocks.tools[position] = blocks.index
    arguments = function.get("arguments")
    if arguments and blocks.tools[position] == blocks.index:
        out.append(event("content_block_delta", {"index": blocks.index, "delta": {
            "type": "input_json_delta", "partial_json": arguments}}))
    return out
