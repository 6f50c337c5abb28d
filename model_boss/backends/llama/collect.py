"""A whole answer gathered from llama.cpp's stream, so that a caller who goes away stops the
generation. llama.cpp's server stops a streamed generation as soon as its connection drops,
but runs a non-streamed one to its end whoever is left to read it; so a non-streamed request
is sent as a stream, and its events are put together into the body the server would have
answered (llama.cpp's native shape, OpenAI's chat and text completions, Anthropic's message).
One difference remains: a stream holds back the bytes of a character not yet complete, so an
answer cut by its token limit in the middle of one (an emoji) ends before it, where the
whole answer would end in a replacement character.

Every generating route is gathered: OpenAI's text completions with ``logprobs`` too (each
event's ``logprobs.content`` adds up to the whole answer's), and the Responses API, whose
``response.completed`` event carries the whole response.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from ...endpoints import CHAT, COMPLETIONS, MESSAGES, RESPONSES
from ..base import UpstreamResponse, upstream_error
from ..sse import sse_data, sse_events

NATIVE = frozenset({"/completion", "/completions", "/infill"})
TEXT = COMPLETIONS
COLLECTED = NATIVE | {CHAT, TEXT, MESSAGES, RESPONSES}


def collectable(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether a non-streamed request on ``endpoint`` is gathered from a stream."""
    return endpoint in COLLECTED


def as_stream(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body, asking for a stream (with the usage, which a whole answer carries)."""
    streamed = {**body, "stream": True}
    if endpoint in (CHAT, TEXT):
        streamed["stream_options"] = {**(body.get("stream_options") or {}),
                                      "include_usage": True}
    return streamed


async def gather(endpoint: str, upstream: UpstreamResponse, model_id: str,
                 on_event: Callable[[bytes], None] | None = None) -> UpstreamResponse:
    """A streamed answer as the whole one (:func:`collect`); a server that answered whole all
    the same: its answer as it is."""
    if upstream.stream is None:
        return upstream
    if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return UpstreamResponse(upstream.status, upstream.headers,
                                body=b"".join([chunk async for chunk in upstream.stream]))
    return UpstreamResponse(upstream.status, {"content-type": "application/json"},
                            body=await collect(endpoint, upstream.stream, model_id, on_event))


async def collect(endpoint: str, chunks: AsyncIterator[bytes], model_id: str,
                  on_event: Callable[[bytes], None] | None = None) -> bytes:
    """The whole answer ``chunks`` add up to; ``on_event`` sees each event as it comes. The
    stream is closed however this ends: a cancelled collect (the caller went away) drops the
    worker's connection, which stops it."""
    events: list[bytes] = []
    try:
        async for whole in sse_events(chunks):
            events.append(whole)
            if on_event is not None:
                on_event(whole)
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
    if endpoint == MESSAGES:
        return orjson.dumps(_message(events, model_id))
    if endpoint == RESPONSES:
        return orjson.dumps(_response(events, model_id))
    datas = [orjson.loads(data) for data in map(sse_data, events)
             if data is not None and data != b"[DONE]"]
    for data in datas:
        if isinstance(data, dict) and data.get("error"):
            status = data["error"].get("code") if isinstance(data["error"], dict) else None
            raise upstream_error(model_id, status if isinstance(status, int) else 500,
                                 orjson.dumps(data))
    if endpoint in NATIVE:
        return orjson.dumps(_native(datas))
    return orjson.dumps(_chat(datas) if endpoint == CHAT else _text(datas))


def _native(datas: list[dict[str, Any]]) -> dict[str, Any]:
    last = dict(datas[-1]) if datas else {}
    last["content"] = "".join(d.get("content") or "" for d in datas)
    last["tokens"] = [t for d in datas for t in d.get("tokens") or []]
    probs = [p for d in datas for p in d.get("completion_probabilities") or []]
    if probs:
        last["completion_probabilities"] = probs
    return last


def _frame(datas: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    first = datas[0] if datas else {}
    whole = {"id": first.get("id"), "object": kind, "created": first.get("created"),
             "model": first.get("model")}
    if first.get("system_fingerprint"):
        whole["system_fingerprint"] = first["system_fingerprint"]
    for data in datas:
        for name in ("usage", "timings"):
            if data.get(name):
                whole[name] = data[name]
    return whole


def _chat(datas: list[dict[str, Any]]) -> dict[str, Any]:
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    logprobs: list[Any] = []
    finish = None
    for data in datas:
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
            for call in delta.get("tool_calls") or []:
                whole = calls.setdefault(int(call.get("index", 0)), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                whole["id"] = call.get("id") or whole["id"]
                function = call.get("function") or {}
                whole["function"]["name"] += function.get("name") or ""
                whole["function"]["arguments"] += function.get("arguments") or ""
            logprobs += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
        message["content"] = message["content"] or None
    return {**_frame(datas, "chat.completion"), "choices": [{
        "index": 0, "message": message, "finish_reason": finish,
        "logprobs": {"content": logprobs} if logprobs else None}]}


def _text(datas: list[dict[str, Any]]) -> dict[str, Any]:
    text: list[str] = []
    logprobs: list[Any] = []
    finish = None
    for data in datas:
        for choice in data.get("choices") or []:
            text.append(choice.get("text") or "")
            logprobs += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
    return {**_frame(datas, "text_completion"), "choices": [{
        "index": 0, "text": "".join(text),
        "logprobs": {"content": logprobs} if logprobs else None, "finish_reason": finish}]}


def _response(events: list[bytes], model_id: str) -> dict[str, Any]:
    """The Responses API's whole response: the one its ``response.completed`` (or
    ``response.incomplete``) event carries; a failure or an error event is the worker's
    error."""
    for whole in events:
        data = sse_data(whole)
        if not data or data == b"[DONE]":
            continue
        event = orjson.loads(data)
        kind = event.get("type")
        if kind in ("error", "response.failed") or (kind is None and "error" in event):
            error = event.get("error") or (event.get("response") or {}).get("error") or event
            status = error.get("code") if isinstance(error, dict) else None
            raise upstream_error(model_id, status if isinstance(status, int) else 500,
                                 orjson.dumps({"error": error}))
        if kind in ("response.completed", "response.incomplete"):
            response = dict(event["response"])
            response.setdefault("completed_at", int(time.time()))
            return response
    raise upstream_error(model_id, 502, orjson.dumps({"error": {
        "message": "the worker's stream ended before its response was complete"}}))


def _message(events: list[bytes], model_id: str) -> dict[str, Any]:
    """Anthropic's message from its events (llama.cpp may leave ``message_start`` out)."""
    message: dict[str, Any] = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message",
                               "role": "assistant", "model": model_id, "content": [],
                               "stop_reason": None, "stop_sequence": None,
                               "usage": {"input_tokens": 0, "output_tokens": 0}}
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for whole in events:
        data = sse_data(whole)
        event = orjson.loads(data) if data else {}
        kind = event.get("type")
        if kind == "error":
            raise upstream_error(model_id, 500, data or b"")
        if kind == "message_start":
            message.update({k: v for k, v in event["message"].items() if k != "content"})
        elif kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            _add_delta(blocks.setdefault(event["index"], {"type": "text", "text": ""}),
                       event["delta"], partial, event["index"])
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            message["usage"] = {**message["usage"], **(event.get("usage") or {})}
    for index, text in partial.items():
        with contextlib.suppress(orjson.JSONDecodeError):
            blocks[index]["input"] = orjson.loads(text or "{}")
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _add_delta(block: dict[str, Any], delta: dict[str, Any], partial: dict[int, str],
               index: int) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "input_json_delta":
        partial[index] = partial.get(index, "") + delta.get("partial_json", "")
