"""A worker's OpenAI-style SSE stream as Ollama's NDJSON stream: one JSON line per piece of
text, tool calls once they are whole, then the closing line with ``done``, ``done_reason``
and the worker's counts and durations. An error event becomes Ollama's ``{"error": ...}``
line (the client raises it), never a broken connection."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson

from .translate import created_at, final_fields, ollama_tool_calls

Shape = Literal["chat", "generate"]


def sse_payloads(buffer: bytearray) -> list[bytes]:
    """Take every complete SSE event out of ``buffer``; return their ``data`` payloads.
    Comments and other fields are skipped; what is left waits for more bytes."""
    payloads = []
    while True:
        text = bytes(buffer).replace(b"\r\n", b"\n")
        end = text.find(b"\n\n")
        if end < 0:
            buffer[:] = text
            return payloads
        event, rest = text[:end], text[end + 2:]
        buffer[:] = rest
        data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if data:
            payloads.append(b"\n".join(data))


class NdjsonStream:
    """Translates one stream. ``model`` is the name the client asked for (Ollama echoes it);
    ``started`` the request's start (monotonic), ``waited_s`` its wait for the model."""

    def __init__(self, shape: Shape, model: str, started: float, waited_s: float) -> None:
        self.shape = shape
        self.model = model
        self.started = started
        self.waited_s = waited_s
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.tool_calls: dict[int, dict[str, Any]] = {}

    def line(self, text: str = "", thinking: str = "", **fields: Any) -> bytes:
        head: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.shape == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if "tool_calls" in fields:
                message["tool_calls"] = fields.pop("tool_calls")
            head["message"] = message
        else:
            head["response"] = text
            if thinking:
                head["thinking"] = thinking
        return orjson.dumps({**head, "done": False, **fields}) + b"\n"

    def closing(self) -> bytes:
        return self.line(**final_fields(self.finish_reason, self.usage, self.timings,
                                        time.monotonic() - self.started, self.waited_s))

    def take(self, event: dict[str, Any]) -> list[bytes]:
        """The lines one worker event makes (often one, sometimes none)."""
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            self.timings = event["timings"]
        lines = []
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content") or choice.get("text") or ""
            thinking = delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            if text or thinking:
                lines.append(self.line(text, thinking))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return lines

    def _add_call(self, part: dict[str, Any]) -> None:
        call = self.tool_calls.setdefault(int(part.get("index", len(self.tool_calls))),
                                          {"function": {"name": "", "arguments": ""}})
        function = part.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    async def translate(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        buffer = bytearray()
        try:
            async for chunk in chunks:
                buffer.extend(chunk)
                for payload in sse_payloads(buffer):
                    if payload.strip() == b"[DONE]":
                        continue
                    try:
                        event = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(event, dict):
                        continue
                    if "error" in event:
                        yield error_line(event["error"])
                        return
                    for line in self.take(event):
                        yield line
            if self.tool_calls:
                calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
                yield self.line(tool_calls=ollama_tool_calls(calls))
            yield self.closing()
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]


def error_line(error: Any) -> bytes:
    message = error.get("message") if isinstance(error, dict) else error
    return orjson.dumps({"error": str(message or "the stream failed")}) + b"\n"
