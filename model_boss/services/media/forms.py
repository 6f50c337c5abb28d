"""Picture and clip requests sent as multipart forms (OpenAI's clients send edits and videos
so): the parts read into the JSON body the same routes take, files as base64 text, numbers
as numbers. A part that should be a file and is not (or the reverse) is a 400 naming it."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from ...errors import BadRequest
from .audio import Upload

# the numbers a form's text stands for (a form has no types)
_WHOLE = {"n", "steps", "seed", "fps", "x_priority"}
_FRACTIONS = {"strength", "guidance", "reference_strength", "seconds", "x_budget_s",
              "x_keep_alive_s"}
EDIT_FILES = frozenset({"image", "mask", "reference_images"})
EDIT_LISTS = frozenset({"image", "reference_images"})
VIDEO_FILES = frozenset({"input_reference"})


def _typed(name: str, value: str) -> Any:
    try:
        if name in _WHOLE:
            return int(value)
        if name in _FRACTIONS:
            return float(value)
    except ValueError:
        raise BadRequest(f"{name}: must be a number, not {value!r}"[:200], param=name,
                         code="invalid_value") from None
    return value


def form_body(parts: Iterable[tuple[str, str | Upload]], files: frozenset[str],
              lists: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The body a form stands for: ``files`` are pictures, as file parts (base64 in the body)
    or as fields already holding base64; a list for the names in ``lists`` (sent as ``name``
    or ``name[]``, once or repeated); every other part is a field, and a file there a 400."""
    body: dict[str, Any] = {}
    for raw_name, value in parts:
        name = raw_name.removesuffix("[]")
        if name in files:  # a file part, or a field holding base64 (a client's extra field)
            if isinstance(value, Upload) and not value.data:
                raise BadRequest(f"{name}: the file is empty", param=name,
                                 code="invalid_value")
            text = base64.b64encode(value.data).decode() if isinstance(value, Upload) \
                else value
            if name in lists:
                body.setdefault(name, []).append(text)
            else:
                body[name] = text
        elif isinstance(value, Upload):
            raise BadRequest(f"{name}: must be a form field, not a file", param=name,
                             code="invalid_value")
        else:
            body[name] = _typed(name, value)
    return body
