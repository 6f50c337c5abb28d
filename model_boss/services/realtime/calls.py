"""A turn's three requests, each through :func:`~model_boss.services.serving.serve` (so the
queue orders them like any other request): speech to text, the chat model's streamed answer,
and one sentence spoken."""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from ...endpoints import CHAT, SPEECH, TRANSCRIPTIONS
from ...errors import ModelBossError
from ..extensions import Extensions
from ..served import Served
from ..serving import serve
from .audio import pcm16_from_wav, wav_of

if TYPE_CHECKING:
    from ...coordinator import Coordinator

# a sentence ends at . ! ? (or a line break) followed by space: spoken once it is whole
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")


async def _whole(served: Served) -> bytes:
    body = served.body if served.chunks is None else b"".join(
        [chunk async for chunk in served.chunks])
    if served.status >= 400:
        raise ModelBossError(body.decode(errors="replace")[:300], code="upstream_error")
    return body


async def transcribe(coord: Coordinator, model: str, pcm16: bytes, rate: int,
                     ext: Extensions, language: str | None = None) -> str:
    """What was said in ``pcm16``, by the transcriber ``model``."""
    body: dict[str, Any] = {"model": model, "response_format": "json",
                            "file": base64.b64encode(wav_of(pcm16, rate)).decode(),
                            "filename": "turn.wav"}
    if language:
        body["language"] = language
    answer = orjson.loads(await _whole(await serve(coord, TRANSCRIPTIONS, body, ext)))
    return str(answer.get("text", "")).strip()


async def chat_deltas(coord: Coordinator, model: str, messages: list[dict[str, str]],
                      ext: Extensions, usage: dict[str, Any],
                      max_tokens: int | None = None) -> AsyncIterator[str]:
    """The chat model's answer, a text delta at a time; its usage is left in ``usage``.
    Close it (``contextlib.aclosing``) when leaving early: that ends the worker's stream."""
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    served = await serve(coord, CHAT, body, ext)
    if served.chunks is None:  # answered whole (an error status)
        await _whole(served)
        return
    pending = b""
    # closed however this ends (an error event, a cancelled answer): the slot goes back now,
    # not when the stream is collected
    async with contextlib.aclosing(served.chunks) as chunks:
        async for chunk in chunks:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if "error" in event:
                    error = event["error"]
                    raise ModelBossError(str(error.get("message", "chat failed")),
                                         code=str(error.get("code") or "upstream_error"))
                usage.update(event.get("usage") or {})
                for choice in event.get("choices") or ():
                    if text := (choice.get("delta") or {}).get("content"):
                        yield text


def sentences(text: str) -> tuple[list[str], str]:
    """The whole sentences at the start of ``text`` and the rest, still being written."""
    parts = _SENTENCE_END.split(text)
    done = [part.strip() for part in parts[:-1] if part.strip()]
    return done, parts[-1]


async def speak(coord: Coordinator, model: str, text: str, voice: str | None, rate: int,
                ext: Extensions) -> bytes:
    """``text`` in the voice ``model`` as PCM16 at ``rate``."""
    body: dict[str, Any] = {"model": model, "input": text, "response_format": "wav"}
    if voice:
        body["voice"] = voice
    return pcm16_from_wav(await _whole(await serve(coord, SPEECH, body, ext)), rate)
