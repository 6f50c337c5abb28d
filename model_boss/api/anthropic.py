"""Anthropic's Messages API on the same port, so clients built on the ``anthropic`` SDK (and
coding agents that speak only it) work unchanged: parse, hand to
:mod:`model_boss.services.anthropic`, answer. Errors on these routes leave in Anthropic's
envelope (:func:`anthropic_error_body`). The key may come as ``x-api-key`` (as the SDK sends
it) or ``Authorization: Bearer``; ``anthropic-version`` and ``anthropic-beta`` are taken and
need no particular value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from ..catalog import BackendKind, ModelManifest
from ..errors import BadRequest, ModelBossError
from ..services.anthropic import (
    COUNT_TOKENS,
    MESSAGES,
    CountTokensRequest,
    MessagesRequest,
    error_body,
    messages,
)
from ..tenancy.keys import identity_of
from .context import coordinator_of, disconnect_watch, to_response
from .errors import documented, error_message

# sent by Anthropic's SDK on every request (OpenAI's never sends it): the routes both APIs
# share (``GET /v1/models`` and ``/v1/models/{id}``) answer in Anthropic's shape when it is there
VERSION_HEADER = "anthropic-version"


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error envelope."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


router = APIRouter(tags=["anthropic"], responses=documented(AnthropicError))


def is_anthropic_path(path: str) -> bool:
    return path in (MESSAGES, COUNT_TOKENS)


@router.post(MESSAGES)
async def create_message(request: Request, body: MessagesRequest) -> Response:
    """A message, whole or streamed (``stream: true``) in Anthropic's events."""
    async with disconnect_watch(request) as gone:
        served = await messages(coordinator_of(request), MESSAGES, body, request.headers,
                              identity_of(request.scope), gone)
    return to_response(served)


@router.post(COUNT_TOKENS)
async def count_tokens(request: Request, body: CountTokensRequest) -> Response:
    """``{"input_tokens": N}``: the prompt's size as the model counts it."""
    async with disconnect_watch(request) as gone:
        served = await messages(coordinator_of(request), COUNT_TOKENS, body, request.headers,
                              identity_of(request.scope),
                                gone)
    return to_response(served)


def anthropic_error_body(status: int, raw: bytes) -> bytes:
    """Any error body as ``{"type": "error", "error": {"type", "message"}}``."""
    return orjson.dumps(error_body(status, error_message(raw)))


def speaks_anthropic(headers: Mapping[str, str]) -> bool:
    """Whether a request on a route both APIs share came from an Anthropic client."""
    return VERSION_HEADER in headers


def model_info(manifest: ModelManifest, created: float) -> dict[str, Any]:
    """A model as Anthropic's ``GET /v1/models`` lists it: ``type``, ``id``,
    ``display_name``, ``created_at`` (RFC 3339; when this daemon started serving it)."""
    info: dict[str, Any] = {
        "type": "model", "id": manifest.id, "display_name": manifest.id,
        "created_at": datetime.fromtimestamp(created, UTC).isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
        "lifecycle": "active", "deprecated_at": None, "retires_at": None}
    if manifest.backend == BackendKind.LLAMA_SERVER:  # the context each request gets
        info["max_input_tokens"] = max(1, manifest.ctx_size // max(1, manifest.concurrency))
    return info


def models_page(models: Sequence[dict[str, Any]], limit: int = 20, after_id: str | None = None,
                before_id: str | None = None) -> dict[str, Any]:
    """One page of Anthropic's model list: ``limit`` (1 to 1000) after ``after_id`` or before
    ``before_id``, with ``has_more``, ``first_id`` and ``last_id``."""
    if not 1 <= limit <= 1000:
        raise BadRequest("limit: must be between 1 and 1000", param="limit")
    ids = [m["id"] for m in models]
    for name, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in ids:
            raise BadRequest(f"{name}: no model '{cursor}' in the list", param=name)
    if before_id is not None:
        end = ids.index(before_id)
        page, more = models[max(0, end - limit):end], end > limit
    else:
        start = ids.index(after_id) + 1 if after_id is not None else 0
        page, more = models[start:start + limit], start + limit < len(models)
    return {"data": list(page), "has_more": more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None}


def anthropic_error(exc: ModelBossError) -> JSONResponse:
    """``exc`` in Anthropic's envelope (a shared route's own error, for an Anthropic client)."""
    return JSONResponse(error_body(exc.status_code, exc.message), status_code=exc.status_code,
                        headers=exc.headers())
