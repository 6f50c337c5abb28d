"""One realtime session, transport-neutral: client events in (:meth:`RealtimeSession.handle`),
server events out through ``emit``. It holds the input audio buffer, the turn detector, the
conversation and at most one response, which runs as a task the session owns: a turn's
transcription, its chat answer and each spoken sentence are requests through the queue, each
with its own request id under the response's (``resp_…/heard``, ``/answer``, ``/said-N``), so
the ledger's rows of one turn are found together.

Barge-in: speech heard while a response runs cancels it (``response.done`` with status
``cancelled``); the answer keeps only the words whose audio was sent, and the client's
``conversation.item.truncate`` cuts it to what was played (by each sentence's audio length).

A key's rates and quotas (``gate``) are asked before each response, which counts as one
request; after it, ``rate_limits.updated`` says what is left of the key's minute."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import ModelBossError
from ..extensions import Extensions
from . import calls
from .conversation import Conversation, Message
from .events import (
    AUDIO_RATE,
    AudioAppend,
    AudioClear,
    AudioCommit,
    EventError,
    ItemCreate,
    ItemTruncate,
    ResponseCancel,
    ResponseCreate,
    Session,
    SessionUpdate,
    TurnDetection,
    error_event,
    new_id,
    parse_client_event,
    server_event,
)
from .turns import SileroTurns, SpeechStarted, TurnSegmenter

if TYPE_CHECKING:
    from ...catalog.manifest import PipelineSpec
    from ...coordinator import Coordinator

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], Awaitable[None]]
HangUp = Callable[[], Awaitable[None]]
BYTES_PER_MS = AUDIO_RATE * 2 // 1000
AUDIO_DELTA_MS = 200  # audio out is sent in pieces of this length


class TurnGate(Protocol):
    """The session key's rates and quotas, asked once per response."""

    def admit(self) -> ModelBossError | None:
        """Why one more response may not start now (None: it may; it is counted)."""

    def rate_limits(self) -> list[dict[str, Any]]:
        """What is left of the key's limits, as ``rate_limits.updated`` lists them."""


class RealtimeSession:
    """A conversation with a pipeline's three models (see the module's docstring)."""

    def __init__(self, coord: Coordinator, model: str, pipeline: PipelineSpec,
                 ext: Extensions, emit: Emit, *, gate: TurnGate | None = None,
                 hang_up: HangUp | None = None) -> None:
        self.coord, self.model, self.pipeline, self.ext = coord, model, pipeline, ext
        self.emit, self.gate, self.hang_up = emit, gate, hang_up
        self.responses = 0  # responses started
        self.id = new_id("sess")
        self.ext.session_id = self.id
        self.instructions: str | None = None
        self.voice: str | None = None
        self.language: str | None = None
        self.max_tokens: int | None = None  # None: the model's own limit ("inf")
        self.detection: TurnDetection | None = TurnDetection()
        self.turns: SileroTurns | None = None
        self.buffer = bytearray()
        self.buffer_start_ms = 0  # where the buffer begins in the session's audio
        self.speech_item: str | None = None
        self.conversation = Conversation()
        self.response: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Load the turn detector (off the event loop), then say ``session.created``."""
        await self._detector()
        await self.emit(server_event("session.created", session=self.describe()))

    async def close(self) -> None:
        """End the response in flight, if any (the socket is gone)."""
        await self._cancel_response()

    async def end(self, why: str) -> None:
        """End the session from this side (the daemon stops): an ``error`` event saying
        why, the response in flight cancelled, the socket closed."""
        await self._cancel_response()
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.emit(error_event(why, "session_ended", kind="server_error"))
        if self.hang_up is not None:
            await self.hang_up()

    @property
    def responding(self) -> bool:
        return self.response is not None and not self.response.done()

    def describe(self) -> dict[str, Any]:
        fmt = {"type": "audio/pcm", "rate": AUDIO_RATE}
        detection = self.detection.model_dump() if self.detection else None
        return {"type": "realtime", "object": "realtime.session", "id": self.id,
                "model": self.model, "output_modalities": ["audio"],
                "instructions": self.instructions or "",
                "max_output_tokens": self.max_tokens or "inf",
                "audio": {"input": {"format": fmt, "turn_detection": detection,
                                    "transcription": {"model": self.pipeline.transcriber}},
                          "output": {"format": fmt, "voice": self.voice}}}

    async def handle(self, raw: str | bytes) -> None:
        """One client event; anything wrong with it is an ``error`` event, never a close."""
        try:
            event = parse_client_event(raw)
        except EventError as exc:
            await self.emit(error_event(str(exc), exc.code, exc.param, exc.event_id))
            return
        try:
            await self._dispatch(event)
        except EventError as exc:
            await self.emit(error_event(str(exc), exc.code, exc.param, event.event_id))

    async def _dispatch(self, event: Any) -> None:
        if isinstance(event, SessionUpdate):
            await self._update(event.session)
        elif isinstance(event, AudioAppend):
            await self._append(event.audio)
        elif isinstance(event, AudioCommit):
            await self._commit(len(self.buffer))
        elif isinstance(event, AudioClear):
            self._clear_buffer(len(self.buffer))
            if self.turns is not None:
                self.turns.reset()
            await self.emit(server_event("input_audio_buffer.cleared"))
        elif isinstance(event, ItemCreate):
            message = self.conversation.add_item(event.item)
            await self.emit(server_event("conversation.item.added",
                                         previous_item_id=event.previous_item_id,
                                         item=message.item()))
        elif isinstance(event, ItemTruncate):
            self.conversation.truncate(event.item_id, event.audio_end_ms)
            await self.emit(server_event("conversation.item.truncated", item_id=event.item_id,
                                         content_index=event.content_index,
                                         audio_end_ms=event.audio_end_ms))
        elif isinstance(event, ResponseCreate):
            self._start_response(None)
        elif isinstance(event, ResponseCancel):
            await self._cancel_response()

    async def _update(self, session: Session) -> None:
        if session.instructions is not None:
            self.instructions = session.instructions
        if session.max_output_tokens is not None:
            self.max_tokens = None if session.max_output_tokens == "inf" \
                else session.max_output_tokens
        audio = session.audio
        if audio and audio.output and audio.output.voice is not None:
            self.voice = audio.output.voice
        if audio and audio.input:
            if "turn_detection" in audio.input.model_fields_set:
                self.detection = audio.input.turn_detection
                await self._detector()
            if audio.input.transcription and audio.input.transcription.language:
                self.language = audio.input.transcription.language
        await self.emit(server_event("session.updated", session=self.describe()))

    async def _detector(self) -> None:
        """A turn detector for the session's settings (None when turn detection is off)."""
        if self.detection is None:
            self.turns = None
            return
        segmenter = TurnSegmenter(self.detection.threshold,
                                  self.detection.silence_duration_ms,
                                  self.detection.prefix_padding_ms)
        if self.turns is not None:
            segmenter.at_ms = self.turns.segmenter.at_ms
        self.turns = await asyncio.to_thread(SileroTurns, segmenter, AUDIO_RATE)

    async def _append(self, audio: str) -> None:
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("audio: not base64", "invalid_value", "audio") from None
        self.buffer += pcm
        if self.turns is None:
            return
        for boundary in await asyncio.to_thread(self.turns.hear, pcm):
            if isinstance(boundary, SpeechStarted):
                self.speech_item = new_id("item")
                await self.emit(server_event("input_audio_buffer.speech_started",
                                             audio_start_ms=boundary.audio_start_ms,
                                             item_id=self.speech_item))
                if self.detection is not None and self.detection.interrupt_response:
                    await self._cancel_response()  # barge-in
                continue
            item_id = self.speech_item or new_id("item")
            await self.emit(server_event("input_audio_buffer.speech_stopped",
                                         audio_end_ms=boundary.audio_end_ms, item_id=item_id))
            end = (boundary.audio_end_ms - self.buffer_start_ms) * BYTES_PER_MS
            await self._commit(max(0, min(end, len(self.buffer))), item_id,
                               respond=self.detection is not None
                               and self.detection.create_response)

    def _clear_buffer(self, upto: int) -> bytes:
        taken = bytes(self.buffer[:upto])
        del self.buffer[:upto]
        self.buffer_start_ms += upto // BYTES_PER_MS
        return taken

    async def _commit(self, upto: int, item_id: str | None = None,
                      respond: bool = False) -> None:
        if upto < 100 * BYTES_PER_MS:
            raise EventError("input_audio_buffer: holds less than 100 ms of audio",
                             "input_audio_buffer_commit_empty")
        audio = self._clear_buffer(upto)
        item_id = item_id or new_id("item")
        self.speech_item = None
        previous = self._last_item_id()
        await self.emit(server_event("input_audio_buffer.committed", item_id=item_id,
                                     previous_item_id=previous))
        message = self.conversation.add("user", "", item_id)
        await self.emit(server_event("conversation.item.added", previous_item_id=previous,
                                     item=message.item("in_progress")))
        if respond:
            self._start_response(audio, message)
        else:
            await self._transcribe(audio, message)

    def _last_item_id(self) -> str | None:
        items = self.conversation.items
        return items[-1].id if items else None

    async def _transcribe(self, audio: bytes, message: Message,
                          request_id: str | None = None) -> None:
        text = await calls.transcribe(self.coord, self.pipeline.transcriber, audio, AUDIO_RATE,
                                      replace(self.ext, request_id=request_id), self.language)
        message.text = text
        await self.emit(server_event("conversation.item.input_audio_transcription.delta",
                                     item_id=message.id, content_index=0, delta=text))
        await self.emit(server_event("conversation.item.input_audio_transcription.completed",
                                     item_id=message.id, content_index=0, transcript=text))
        await self.emit(server_event("conversation.item.done", item=message.item()))

    def _start_response(self, audio: bytes | None, heard: Message | None = None) -> None:
        if self.responding:
            raise EventError("a response is in progress: cancel it first",
                             "conversation_already_has_active_response")
        refused = self.gate.admit() if self.gate is not None else None
        if refused is not None:
            raise EventError(refused.message, refused.code or "rate_limited",
                             refused.param)
        self.responses += 1
        self.response = asyncio.create_task(self._respond(audio, heard))

    async def _cancel_response(self) -> None:
        task, self.response = self.response, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _respond(self, audio: bytes | None, heard: Message | None) -> None:
        """One response: the turn heard (transcribed), the answer's text and its voice a
        sentence at a time; ``response.done`` says how it ended (cancelled, failed)."""
        response_id, item = new_id("resp"), self.conversation.add("assistant", "")
        self.conversation.items.remove(item)  # joins the conversation once it has words
        usage: dict[str, Any] = {}
        status, error = "completed", None
        await self.emit(server_event("response.created", response=self._response(
            response_id, "in_progress", [], usage)))
        try:
            if audio is not None and heard is not None:
                await self._transcribe(audio, heard, f"{response_id}/heard")
            await self._answer(response_id, item, usage)
        except asyncio.CancelledError:
            status = "cancelled"
            item.keep_said()  # what was not voiced was never heard
            raise
        except ModelBossError as exc:
            status, error = "failed", exc
        except Exception as exc:
            log.exception("realtime session %s: response %s failed", self.id, response_id)
            status, error = "failed", ModelBossError(f"response failed: {exc}")
        finally:
            if item.text:
                self.conversation.items.append(item)
            if error is not None:
                await self.emit(error_event(error.message, error.code or "response_failed",
                                            error.param, kind=error.error_type))
            await asyncio.shield(self._done(response_id, status, item, usage))

    async def _done(self, response_id: str, status: str, item: Message,
                    usage: dict[str, Any]) -> None:
        await self.emit(server_event("response.done", response=(
            self._response(response_id, status, [item.item(status)], usage))))
        limits = self.gate.rate_limits() if self.gate is not None else []
        if limits:
            await self.emit(server_event("rate_limits.updated", rate_limits=limits))

    async def _answer(self, response_id: str, item: Message, usage: dict[str, Any]) -> None:
        ids = {"response_id": response_id, "item_id": item.id, "output_index": 0,
               "content_index": 0}
        messages = self.conversation.messages(self.instructions)
        pending = ""
        deltas = calls.chat_deltas(self.coord, self.pipeline.llm, messages,
                                   replace(self.ext, request_id=f"{response_id}/answer"), usage,
                                   self.max_tokens)
        async with contextlib.aclosing(deltas):  # a cancelled answer ends the chat's stream
            async for delta in deltas:
                item.text += delta
                await self.emit(server_event("response.output_audio_transcript.delta", **ids,
                                             delta=delta))
                done, pending = calls.sentences(pending + delta)
                for sentence in done:
                    await self._say(sentence, item, ids)
        if pending.strip():
            await self._say(pending.strip(), item, ids)
        item.text = item.text.strip()
        await self.emit(server_event("response.output_audio.done", **ids))
        await self.emit(server_event("response.output_audio_transcript.done", **ids,
                                     transcript=item.text))

    async def _say(self, sentence: str, item: Message, ids: dict[str, Any]) -> None:
        if not any(char.isalnum() for char in sentence):  # nothing a voice could say
            return
        ext = replace(self.ext, request_id=f"{ids['response_id']}/said-{len(item.said) + 1}")
        pcm = await calls.speak(self.coord, self.pipeline.voice, sentence, self.voice,
                                AUDIO_RATE, ext)
        item.voiced(sentence, len(pcm) / BYTES_PER_MS)
        step = AUDIO_DELTA_MS * BYTES_PER_MS
        for start in range(0, len(pcm), step):
            await self.emit(server_event("response.output_audio.delta", **ids,
                                         delta=base64.b64encode(pcm[start:start + step])
                                         .decode()))

    def _response(self, response_id: str, status: str, output: list[dict[str, Any]],
                  usage: dict[str, Any]) -> dict[str, Any]:
        tokens_in = int(usage.get("prompt_tokens") or 0)
        tokens_out = int(usage.get("completion_tokens") or 0)
        return {"object": "realtime.response", "id": response_id, "status": status,
                "output": output, "output_modalities": ["audio"],
                "usage": {"total_tokens": tokens_in + tokens_out, "input_tokens": tokens_in,
                          "output_tokens": tokens_out}}
