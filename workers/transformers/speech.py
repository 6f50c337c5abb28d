"""Speech in OpenAI's shapes: a transcript in each ``response_format`` the audio endpoints
name, text cut into sentences for synthesis piece by piece, and a ``voice`` as a speaker."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from .errors import WorkerError

_SENTENCE_END = re.compile(r"(?<=[.!?;:。！？])\s+|\n+")
MAX_PIECE_CHARS = 400  # a sentence longer than this is cut at a space


class EndingStream(StreamingResponse):
    """A stream that calls ``ended(finished)`` once however it ends: read to its end, its
    reader gone mid-way, or never begun (a generator that never started has no ``finally`` to
    run, so a ticket closed there would stay open)."""

    def __init__(self, content: AsyncIterator[bytes], ended: Callable[[bool], None],
                 media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._ended = ended
        self.finished = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self._ended(self.finished)


def transcript(heard: dict[str, Any], response_format: str, task: str) -> Response:
    """``heard`` (text, duration, language, segments, words?) as the client asked for it."""
    text, segments = heard["text"], heard["segments"]
    # the seconds heard, as OpenAI's usage counts them (whole, at least one): in a header
    # too, for the answers with no usage field (text, srt, vtt)
    seconds = max(1, round(heard["duration"]))
    heard_header = {"x-audio-seconds": str(seconds)}
    if response_format == "text":
        return PlainTextResponse(text + "\n", headers=heard_header)
    if response_format == "srt":
        blocks = [f"{n}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n"
                  f"{s['text'].strip()}\n" for n, s in enumerate(segments, 1)]
        return PlainTextResponse("\n".join(blocks), media_type="application/x-subrip",
                                 headers=heard_header)
    if response_format == "vtt":
        blocks = [f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text'].strip()}\n"
                  for s in segments]
        return PlainTextResponse("WEBVTT\n\n" + "\n".join(blocks), media_type="text/vtt",
                                 headers=heard_header)
    usage = {"type": "duration", "seconds": seconds}
    if response_format == "json":
        return JSONResponse({"text": text, "usage": usage}, headers=heard_header)
    body: dict[str, Any] = {
        "task": task, "language": _language_name(heard.get("language")),
        "duration": heard["duration"], "text": text,
        "segments": [{"id": n, "seek": int(s["start"] * 100), "start": s["start"],
                      "end": s["end"], "text": s["text"]} for n, s in enumerate(segments)],
        "usage": usage}
    if "words" in heard:
        body["words"] = heard["words"]
    return JSONResponse(body, headers=heard_header)


def _clock(seconds: float, comma: str) -> str:
    millis = int(round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{comma}{millis:03d}"


_NAMES = {"en": "english", "fr": "french", "de": "german", "es": "spanish", "it": "italian",
          "pt": "portuguese", "nl": "dutch", "ja": "japanese", "zh": "chinese", "ru": "russian"}


def _language_name(code: str | None) -> str:
    """OpenAI's verbose_json names the language ("english"); an unknown code is kept."""
    if not code:
        return "unknown"
    return _NAMES.get(code.lower(), code)


def sentences(text: str) -> list[str]:
    """The input cut where a sentence ends (and overlong ones at a space), so the first
    piece is heard while the rest is made."""
    pieces: list[str] = []
    for sentence in (p.strip() for p in _SENTENCE_END.split(text)):
        while len(sentence) > MAX_PIECE_CHARS:
            cut = sentence.rfind(" ", 0, MAX_PIECE_CHARS)
            cut = cut if cut > 0 else MAX_PIECE_CHARS
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            pieces.append(sentence)
    return pieces or [text.strip() or text]


def speaker(voice: str | None, speakers: int) -> int | None:
    """A multi-speaker model's speaker: ``voice`` as its number ("0", "3"); OpenAI's voice
    names (alloy, nova, ...) pick speaker 0. A single-speaker model speaks as itself."""
    if speakers <= 1 or voice is None:
        return None
    if voice.isdigit():
        number = int(voice)
        if number >= speakers:
            raise WorkerError(400, f"voice: this model has speakers 0 to {speakers - 1}",
                              "invalid_value", "voice")
        return number
    return 0
