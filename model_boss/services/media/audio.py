"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: a multipart upload (the
shape OpenAI's clients send) read into the body a speech-recognition worker takes, the audio
as base64 in ``file``. The upload's size is bounded before it is read (``max_upload_bytes``,
in the body limit); the audio itself is decoded by the worker, which answers an undecodable
file with a 400."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ...endpoints import TRANSCRIPTIONS, TRANSLATIONS
from ...errors import BadRequest
from ..schemas import TranscriptionRequest
from ..validation import bad_request

# the paths whose body is an upload (sized by max_upload_bytes), with their unprefixed aliases
UPLOAD_PATHS = frozenset({TRANSCRIPTIONS, TRANSLATIONS, TRANSCRIPTIONS.removeprefix("/v1"),
                          TRANSLATIONS.removeprefix("/v1")})
_LISTS = {"timestamp_granularities"}  # sent as name[] (OpenAI's clients) or repeated
# a form's values are text: these are read as the numbers and flags they stand for
_NUMBERS = {"temperature": float, "x_priority": int, "x_budget_s": float,
            "x_keep_alive_s": float}
_FLAGS = {"stream", "x_thinking"}


def _typed(name: str, value: str) -> Any:
    kind = _NUMBERS.get(name)
    try:
        return kind(value) if kind is not None else value
    except ValueError:
        return value  # refused by name as "must be a number"


@dataclass(frozen=True, slots=True)
class Upload:
    """A file part of the form, read."""

    filename: str | None
    data: bytes


def transcription_body(form: Iterable[tuple[str, str | Upload]]) -> dict[str, Any]:
    """The worker's body from the form's parts; a 400 naming the field for anything wrong."""
    fields: dict[str, Any] = {}
    upload: Upload | None = None
    for raw_name, value in form:
        name = raw_name.removesuffix("[]")
        if name == "file":
            if not isinstance(value, Upload):
                raise BadRequest("file: must be a file (multipart/form-data with a filename)",
                                 param="file", code="invalid_value")
            upload = value
        elif isinstance(value, Upload):
            raise BadRequest(f"{name}: must be a form field, not a file", param=name,
                             code="invalid_value")
        elif name in _LISTS:
            fields.setdefault(name, []).append(value)
        elif name in _FLAGS and value.lower() in ("true", "false"):
            fields[name] = value.lower() == "true"
        else:
            fields[name] = _typed(name, value)
    if upload is None:
        raise BadRequest("file: required (the audio, as multipart/form-data)", param="file",
                         code="missing_field")
    try:
        parsed = TranscriptionRequest.model_validate(fields)
    except ValidationError as exc:
        raise bad_request(exc.errors()) from None
    if parsed.stream:
        raise BadRequest("stream: transcripts are answered whole", param="stream",
                         code="invalid_value")
    data = upload.data
    if not data:
        raise BadRequest("file: the file is empty", param="file", code="invalid_value")
    body = parsed.model_dump(exclude_unset=True)
    body["file"] = base64.b64encode(data).decode()
    body["filename"] = upload.filename or "audio"
    return body
