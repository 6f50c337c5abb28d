"""A picture or clip request's body as it came: a multipart form (OpenAI's clients) or JSON."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from starlette.datastructures import UploadFile

from ...errors import BadRequest
from ...services.media.audio import Upload
from ...services.media.forms import form_body

MAX_PARTS = 32  # pictures and fields in one form


async def read_body(request: Request, files: frozenset[str],
                    lists: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The request's fields: a form's parts read (:func:`form_body`; a urlencoded form has
    no file parts, its pictures are base64 fields), or its JSON object."""
    kind = request.headers.get("content-type", "")
    if kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        async with request.form(max_files=MAX_PARTS, max_fields=MAX_PARTS) as form:
            parts = [(name, Upload(value.filename, await value.read())
                      if isinstance(value, UploadFile) else value)
                     for name, value in form.multi_items()]
        return form_body(parts, files, lists)
    if kind.startswith("application/json") or not kind:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}"[:300],
                             code="invalid_json") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object", code="invalid_json")
        return body
    raise BadRequest("send the request as multipart/form-data (pictures as file parts) or as "
                     "JSON (pictures as base64)", code="invalid_content_type")
