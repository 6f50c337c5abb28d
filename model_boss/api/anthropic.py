"""Anthropic's Messages API on the same port, so clients built on the ``anthropic`` SDK (and
coding agents that speak only it) work unchanged: parse, hand to
:mod:`model_boss.services.anthropic`, answer. Errors on these routes leave in Anthropic's
envelope (:func:`anthropic_error_body`). The key may come as ``x-api-key`` (as the SDK sends
it) or ``Authorization: Bearer``; ``anthropic-version`` and ``anthropic-beta`` are taken and
need no particular value."""

from __future__ import annotations

from typing import Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from ..services.anthropic import (
    COUNT_TOKENS,
    MESSAGES,
    CountTokensRequest,
    MessagesRequest,
    error_body,
    messages,
)
from .context import coordinator_of, disconnect_watch, to_response
from .errors import documented, error_message


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
        served = await messages(coordinator_of(request), MESSAGES, body, request.headers, gone)
    return to_response(served)


@router.post(COUNT_TOKENS)
async def count_tokens(request: Request, body: CountTokensRequest) -> Response:
    """``{"input_tokens": N}``: the prompt's size as the model counts it."""
    async with disconnect_watch(request) as gone:
        served = await messages(coordinator_of(request), COUNT_TOKENS, body, request.headers,
                                gone)
    return to_response(served)


def anthropic_error_body(status: int, raw: bytes) -> bytes:
    """Any error body as ``{"type": "error", "error": {"type", "message"}}``."""
    return orjson.dumps(error_body(status, error_message(raw)))
