"""The OpenAI-compatible surface: /v1/models, chat and text completions, embeddings, speech."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..inference import SlotState
from ..services import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    SpeechRequest,
    pop_extensions,
    serve,
)
from ..services.schemas import OpenAIRequest
from .context import coordinator_of, disconnect_watch, to_response

router = APIRouter(tags=["openai"])


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


async def _serve(request: Request, endpoint: str, body: OpenAIRequest) -> Response:
    data = body.model_dump(exclude_unset=True)
    ext = pop_extensions(data, request.headers)
    async with disconnect_watch(request) as gone:
        served = await serve(coordinator_of(request), endpoint, data, ext, disconnected=gone)
    return to_response(served)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatRequest) -> Response:
    return await _serve(request, "/v1/chat/completions", body)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest) -> Response:
    return await _serve(request, "/v1/completions", body)


@router.post("/v1/embeddings")
async def embeddings(request: Request, body: EmbeddingRequest) -> Response:
    return await _serve(request, "/v1/embeddings", body)


@router.post("/v1/audio/speech")
async def speech(request: Request, body: SpeechRequest) -> Response:
    return await _serve(request, "/v1/audio/speech", body)
