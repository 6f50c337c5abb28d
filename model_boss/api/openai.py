"""The OpenAI-compatible surface: /v1/models, chat and text completions, embeddings."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ..coordinator import Coordinator
from ..errors import BadRequest, Forbidden, ModelBossError
from ..inference import QueuedRequest, SlotState, SlotTicket
from .errors import sse_error
from .requests import (
    ClientDisconnected,
    Extensions,
    pop_extensions,
    read_json_body,
    unless_disconnected,
)

log = logging.getLogger(__name__)
router = APIRouter()

MODEL_HEADER = "x-model-boss-model"


def coordinator_of(request: Request) -> Coordinator:
    return request.app.state.coordinator


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


def validate_chat(body: dict[str, Any]) -> None:
    messages = _require(body, "messages", list, "a non-empty array of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'",
                             param=f"messages[{i}]")
    _check_common(body)


def validate_completion(body: dict[str, Any]) -> None:
    _require(body, "prompt", (str, list), "a non-empty string or array")
    _check_common(body)


def validate_embedding(body: dict[str, Any]) -> None:
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


def queued_request(coord: Coordinator, model_id: str, ext: Extensions,
                   endpoint: str) -> QueuedRequest:
    """Apply the client profile and defaults, producing the queue's view of the request."""
    settings = coord.settings
    client_id = ext.client_id or "anonymous"
    profile = settings.clients.get(client_id)
    entry = coord.catalog.get(model_id)
    if profile and profile.allowed_models is not None:
        allowed = set(profile.allowed_models)
        if not allowed.intersection(entry.manifest.names):
            raise Forbidden(f"client '{client_id}' may not use model '{model_id}'",
                            param="model")
    priority = ext.priority
    if priority is None and profile and profile.priority is not None:
        priority = profile.priority
    if priority is None:
        priority = entry.manifest.priority
    if priority is None:
        priority = settings.default_priority
    return QueuedRequest(model_id=entry.manifest.id, priority=priority, client_id=client_id,
                         endpoint=endpoint, budget_s=ext.budget_s, keep_alive_s=ext.keep_alive_s,
                         max_concurrency=profile.max_concurrency if profile else None)


async def serve(request: Request, endpoint: str, body: dict[str, Any],
                ext: Extensions) -> Response:
    """Queue, get a READY slot, forward to its worker, pass the answer through."""
    coord = coordinator_of(request)
    model = _require(body, "model", str, "a non-empty string")
    entry = coord.catalog.get_available(model)
    queued = queued_request(coord, entry.manifest.id, ext, endpoint)
    body["model"] = entry.manifest.id
    stream = bool(body.get("stream"))
    try:
        ticket: SlotTicket = await unless_disconnected(request, coord.queue.acquire(queued))
    except ClientDisconnected:
        return Response(status_code=499)
    headers = {MODEL_HEADER: entry.manifest.id, "x-model-boss-queue-wait-s": str(ticket.waited_s)}
    backend = ticket.slot.backend
    try:
        if backend is None:
            raise ModelBossError(f"'{entry.manifest.id}' lost its worker before the request ran",
                                 status_code=502, code="worker_failed")
        upstream = await unless_disconnected(
            request, backend.handle_request(endpoint, body, stream))
    except ClientDisconnected:
        ticket.release(ok=False, client_fault=True)
        return Response(status_code=499)
    except BaseException as exc:
        ticket.release(ok=False, client_fault=_client_fault(exc))
        raise
    if upstream.stream is None:
        ticket.release(ok=True)
        return Response(upstream.body, status_code=upstream.status, headers=headers,
                        media_type=upstream.headers.get("content-type", "application/json"))
    return StreamingResponse(_relay(upstream.stream, ticket, entry.manifest.id),
                             status_code=upstream.status, headers=headers,
                             media_type=upstream.headers.get("content-type",
                                                             "text/event-stream"))


def _client_fault(exc: BaseException) -> bool:
    return isinstance(exc, ModelBossError) and 400 <= exc.status_code < 500


async def _relay(chunks: AsyncIterator[bytes], ticket: SlotTicket,
                 model_id: str) -> AsyncIterator[bytes]:
    """Pass chunks through untouched; a failure mid-stream becomes an SSE error + [DONE]."""
    ok = False
    try:
        async for chunk in chunks:
            yield chunk
        ok = True
    except ModelBossError as exc:
        log.warning("stream from %s failed: %s", model_id, exc.message)
        yield sse_error(exc)
        yield b"data: [DONE]\n\n"
    except Exception as exc:
        log.exception("stream from %s failed", model_id)
        yield sse_error(exc)
        yield b"data: [DONE]\n\n"
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
        ticket.release(ok=ok)


async def _endpoint(request: Request, endpoint: str, validate) -> Response:
    coord = coordinator_of(request)
    body = await read_json_body(request, coord.settings.max_body_bytes)
    ext = pop_extensions(body, request)
    validate(body)
    started = time.monotonic()
    response = await serve(request, endpoint, body, ext)
    coord.metrics.observe_request(body.get("model", "?"), endpoint, response.status_code,
                                  time.monotonic() - started)
    return response


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _endpoint(request, "/v1/chat/completions", validate_chat)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _endpoint(request, "/v1/completions", validate_completion)


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    return await _endpoint(request, "/v1/embeddings", validate_embedding)


def dumps(data: Any) -> bytes:
    return orjson.dumps(data)
