"""An answer told as Anthropic tells it, whichever worker gave it: ``msg_`` and ``toolu_`` ids,
the prompt's tokens split by the request's ``cache_control`` breakpoints into cache reads,
cache writes and plain input, and ``model_context_window_exceeded`` when the context filled
before ``max_tokens`` did. :func:`tell_message` for a whole message, :func:`tell_events` for a
stream's events (applied before the stream is relayed, so the usage ledger reads the same
figures as the client)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from ...backends.sse import sse_data, sse_events
from .translate import message_id, tool_use_id

CONTEXT_FULL = "model_context_window_exceeded"
_NOT_AN_ID = re.compile(r"[^A-Za-z0-9_-]")
_FOREIGN_PREFIXES = ("chatcmpl-", "chatcmpl_", "msg-", "call_", "call-")


@dataclass(frozen=True, slots=True)
class AnswerFacts:
    """What the request says that its answer is told by: ``max_tokens``, and the share of
    the prompt (in characters, in Anthropic's order tools → system → messages) that comes
    after its last ``cache_control`` breakpoint (None: no breakpoint)."""

    max_tokens: int | None = None
    uncached_tail: float | None = None

    @classmethod
    def of(cls, body: dict[str, Any]) -> AnswerFacts:
        sizes: list[tuple[int, bool]] = []  # (characters, a breakpoint at its end)
        for tool in body.get("tools") or []:
            sizes.append((len(orjson.dumps(tool)), bool(tool.get("cache_control"))))
        for block in body.get("system") or []:
            sizes.append(_block_size(block))
        for message in body.get("messages") or []:
            content = message.get("content")
            if isinstance(content, str):
                sizes.append((len(content), False))
                continue
            sizes += [_block_size(block) for block in content or []]
            sizes.append((0, bool(message.get("cache_control"))))
        if body.get("cache_control"):  # automatic caching: a breakpoint at the prompt's end
            sizes.append((0, True))
        total = sum(size for size, _ in sizes)
        last = max((i for i, (_, marked) in enumerate(sizes) if marked), default=None)
        if last is None:
            return cls(max_tokens=body.get("max_tokens"))
        tail = sum(size for size, _ in sizes[last + 1:])
        return cls(max_tokens=body.get("max_tokens"),
                   uncached_tail=tail / total if total else 0.0)


def _block_size(block: dict[str, Any]) -> tuple[int, bool]:
    marked = bool(block.get("cache_control"))
    if block.get("type") == "text":
        return len(block.get("text") or ""), marked
    return len(orjson.dumps(block)), marked


def anthropic_id(given: Any, prefix: str) -> str:
    """An id in Anthropic's form (``msg_…``, ``toolu_…``), the same for the same given id so a
    stream and a whole answer agree; a fresh one for none."""
    if isinstance(given, str) and given.startswith(prefix):
        return given
    text = given if isinstance(given, str) else ""
    for foreign in _FOREIGN_PREFIXES:
        text = text.removeprefix(foreign)
    text = _NOT_AN_ID.sub("", text)
    if not text:
        return message_id() if prefix == "msg_" else tool_use_id()
    return prefix + text


def usage(said: dict[str, Any], facts: AnswerFacts) -> dict[str, int]:
    """A worker's Anthropic usage (input tokens apart from its cache reads) with the prompt
    split as the request's breakpoints have it: what the worker took from its cache is read;
    the rest up to the last breakpoint is written (llama.cpp keeps the whole prompt, so the
    next request reads it); the rest after it is plain input."""
    read = int(said.get("cache_read_input_tokens") or 0)
    written = int(said.get("cache_creation_input_tokens") or 0)
    prompt = int(said.get("input_tokens") or 0) + read + written
    out: dict[str, int] = {"input_tokens": prompt - read, "output_tokens":
                           int(said.get("output_tokens") or 0)}
    if facts.uncached_tail is not None:
        before = round(prompt * (1 - facts.uncached_tail))
        written = max(0, min(before, prompt) - read)
        out["input_tokens"] = prompt - read - written
        out["cache_creation_input_tokens"] = written
        out["cache_read_input_tokens"] = read
    elif read or written:
        out["cache_read_input_tokens"] = read
        if written:
            out["cache_creation_input_tokens"] = written
    return out


def stop_reason(reason: Any, told: dict[str, int], facts: AnswerFacts) -> Any:
    """``max_tokens`` reached before ``max_tokens`` tokens came out is a context that filled
    (llama.cpp says max_tokens either way), when the worker said how many it gave."""
    if reason != "max_tokens" or facts.max_tokens is None:
        return reason
    counted = told["output_tokens"] or told["input_tokens"] \
        or told.get("cache_read_input_tokens") or told.get("cache_creation_input_tokens")
    return CONTEXT_FULL if counted and told["output_tokens"] < facts.max_tokens else reason


def tell_message(data: dict[str, Any], facts: AnswerFacts) -> dict[str, Any]:
    """A whole message as Anthropic tells one (see the module's docstring)."""
    data = dict(data)
    data["id"] = anthropic_id(data.get("id"), "msg_")
    content = []
    for block in data.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            block = {**block, "id": anthropic_id(block.get("id"), "toolu_")}
        content.append(block)
    data["content"] = content
    told = usage(data.get("usage") or {}, facts)
    data["usage"] = told
    data["stop_reason"] = stop_reason(data.get("stop_reason"), told, facts)
    return data


def tell_body(raw: bytes, facts: AnswerFacts, model_id: str | None = None) -> bytes:
    """:func:`tell_message` over a body (named after ``model_id``); a body that is no
    message goes as it is."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if not isinstance(data, dict) or data.get("type") != "message":
        return raw
    if model_id is not None:
        data["model"] = model_id
    return orjson.dumps(tell_message(data, facts))


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) \
        + b"\n\n"


async def tell_events(chunks: AsyncIterator[bytes], facts: AnswerFacts) -> AsyncIterator[bytes]:
    """A Messages stream told as Anthropic tells one: tool ids rewritten, the usage that
    ``message_start`` gave (input and cache reads) carried to ``message_delta`` with the
    output (a stream opened before the worker answered sent its ``message_start`` early),
    and the stop reason of a full context."""
    started: dict[str, Any] = {}
    try:
        async for whole in sse_events(chunks):
            data = sse_data(whole)
            kind = _kind(whole)
            if data is None or kind not in ("message_start", "content_block_start",
                                            "message_delta"):
                yield whole
                continue
            body = orjson.loads(data)
            if kind == "message_start":
                started = dict((body.get("message") or {}).get("usage") or {})
                yield whole
            elif kind == "content_block_start":
                block = body.get("content_block") or {}
                if block.get("type") == "tool_use":
                    body["content_block"] = {**block, "id": anthropic_id(block.get("id"),
                                                                         "toolu_")}
                    whole = event(kind, {k: v for k, v in body.items() if k != "type"})
                yield whole
            else:
                told = usage({**started, **(body.get("usage") or {})}, facts)
                delta = dict(body.get("delta") or {})
                delta["stop_reason"] = stop_reason(delta.get("stop_reason"), told, facts)
                yield event(kind, {**{k: v for k, v in body.items() if k != "type"},
                                   "delta": delta, "usage": told})
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]


def _kind(whole: bytes) -> str | None:
    if whole.startswith(b"event: "):
        return whole[7:whole.find(b"\n")].decode(errors="replace").strip()
    return None
