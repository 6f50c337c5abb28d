"""The OpenAI-compatible surface: /v1/models, chat and text completions, embeddings."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..errors import BadRequest
from ..inference import SlotState
from .proxy import coordinator_of, serve
from .requests import (
    ClientDisconnected,
    cancelled_on_disconnect,
    pop_extensions,
    read_json_body,
)

log = logging.getLogger(__name__)
router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    coord = coordinator_of(request)
    data = []
    for entry in coord.catalog:
        m = entry.manifest
        slot = coord.pool.slots.get(m.id)
        data.append({
            "id": m.id, "object": "model", "created": int(coord.started_at),
            "owned_by": "model-boss", "aliases": m.aliases, "category": str(m.category),
            "backend": str(m.backend), "available": entry.available,
            "unavailable_reason": entry.unavailable_reason,
            "state": str(slot.state) if slot else str(SlotState.IDLE),
            "pinned": slot.pinned if slot else m.pin,
        })
    return {"object": "list", "data": data}


def _require(body: dict[str, Any], field: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(field)
    if value is None:
        raise BadRequest(f"'{field}' is required", param=field, code="missing_field")
    if not isinstance(value, kind) or (hasattr(value, "__len__") and len(value) == 0):
        raise BadRequest(f"'{field}' must be {what}", param=field)
    return value


def _check_model(body: dict[str, Any]) -> None:
    if "model" in body and (not isinstance(body["model"], str) or not body["model"]):
        raise BadRequest("'model' must be a non-empty string", param="model")


def validate_chat(body: dict[str, Any]) -> None:
    _check_model(body)
    messages = _require(body, "messages", list, "a non-empty array of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'",
                             param=f"messages[{i}]")
    _check_common(body)


def validate_completion(body: dict[str, Any]) -> None:
    _check_model(body)
    _require(body, "prompt", (str, list), "a non-empty string or array")
    _check_common(body)


def validate_embedding(body: dict[str, Any]) -> None:
    _check_model(body)
    _require(body, "input", (str, list), "a non-empty string or array")


def _check_common(body: dict[str, Any]) -> None:
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be true or false", param="stream")
    for field in ("max_tokens", "n"):
        if field in body and body[field] is not None and (
                isinstance(body[field], bool) or not isinstance(body[field], int)
                or body[field] < 1):
            raise BadRequest(f"'{field}' must be a positive integer", param=field)
    if "temperature" in body and body["temperature"] is not None and (
            isinstance(body["temperature"], bool)
            or not isinstance(body["temperature"], (int, float))
            or not 0 <= body["temperature"] <= 2):
        raise BadRequest("'temperature' must be a number between 0 and 2", param="temperature")


async def _endpoint(request: Request, endpoint: str, validate) -> Response:
    coord = coordinator_of(request)
    body = await read_json_body(request, coord.settings.max_body_bytes)
    ext = pop_extensions(body, request.headers)
    validate(body)
    try:
        async with cancelled_on_disconnect(request):
            return await serve(coord, endpoint, body, ext)
    except ClientDisconnected:
        return Response(status_code=499)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _endpoint(request, "/v1/chat/completions", validate_chat)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _endpoint(request, "/v1/completions", validate_completion)


def validate_speech(body: dict[str, Any]) -> None:
    _check_model(body)
    text = _require(body, "input", str, "a non-empty string")
    if len(text) > 4096:
        raise BadRequest("'input' is longer than 4096 characters", param="input")
    if "voice" in body and not isinstance(body["voice"], str):
        raise BadRequest("'voice' must be a string", param="voice")


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    return await _endpoint(request, "/v1/audio/speech", validate_speech)


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    return await _endpoint(request, "/v1/embeddings", validate_embedding)
