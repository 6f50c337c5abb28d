"""The Realtime API's client events (GA names), parsed with pydantic, and the server events'
one shape. A malformed or unknown event is a :class:`EventError` naming what is wrong; the
session answers it with an ``error`` event and stays open."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# the only audio format spoken here, both ways: 16-bit mono PCM at 24 kHz (OpenAI's default)
AUDIO_RATE = 24000


class EventError(ValueError):
    """A client event that cannot be taken: ``code`` and ``param`` as the ``error`` event says
    them, ``event_id`` the client's own id for it when it gave one."""

    def __init__(self, message: str, code: str, param: str | None = None,
                 event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param, self.event_id = code, param, event_id


class _Loose(BaseModel):
    # the GA session carries fields this server does not act on (tools, tracing, ...): kept
    model_config = ConfigDict(extra="allow")


class AudioFormat(_Loose):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = AUDIO_RATE


class TurnDetection(_Loose):
    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(default=0.5, gt=0, lt=1)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=100, le=10000)
    create_response: bool = True
    interrupt_response: bool = True  # speech heard while an answer runs cancels it


class Transcription(_Loose):
    model: str | None = None
    language: str | None = None


class AudioInput(_Loose):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | None = None
    transcription: Transcription | None = None


class AudioOutput(_Loose):
    format: AudioFormat | None = None
    voice: str | None = None


class Audio(_Loose):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class Session(_Loose):
    type: Literal["realtime"] = "realtime"
    instructions: str | None = None
    audio: Audio | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=4096)] | Literal["inf"] | None = None


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: Session


class AudioAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str  # base64 PCM16


class AudioCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ContentPart(_Loose):
    type: Literal["input_text", "output_text", "input_audio", "output_audio", "text"]
    text: str | None = None
    transcript: str | None = None


class Item(_Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(min_length=1)
    id: str | None = None


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: str | None = None


class ItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: dict[str, Any] | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


ClientEvent = Annotated[SessionUpdate | AudioAppend | AudioCommit | AudioClear | ItemCreate
                        | ItemTruncate | ResponseCreate | ResponseCancel,
                        Field(discriminator="type")]
KNOWN_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
               "input_audio_buffer.clear", "conversation.item.create",
               "conversation.item.truncate", "response.create", "response.cancel")
_EVENTS: TypeAdapter[Any] = TypeAdapter(ClientEvent)


def parse_client_event(raw: str | bytes) -> Any:
    """One client event from its JSON text; :class:`EventError` naming what is wrong."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise EventError("the event is not valid JSON", "invalid_json") from None
    if not isinstance(data, dict):
        raise EventError("an event is a JSON object", "invalid_event")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise EventError("type: required (the event's name)", "missing_field", "type",
                         event_id)
    if kind not in KNOWN_TYPES:
        raise EventError(f"type: unknown event type '{kind[:100]}'", "unknown_event", "type",
                         event_id)
    try:
        return _EVENTS.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:]) or "event"
        raise EventError(f"{kind}: {where}: {first['msg']}", "invalid_value", where,
                         event_id) from None


def new_id(prefix: str) -> str:
    """A server-made id in OpenAI's shape (``item_…``, ``resp_…``, ``event_…``)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event: its own ``event_id``, its ``type``, then its fields."""
    return {"event_id": new_id("event"), "type": kind, **fields}


def error_event(message: str, code: str, param: str | None = None,
                event_id: str | None = None,
                kind: str = "invalid_request_error") -> dict[str, Any]:
    """The ``error`` event: the OpenAI envelope's fields, with the client event it answers."""
    return server_event("error", error={"type": kind, "code": code, "message": message,
                                        "param": param, "event_id": event_id})
