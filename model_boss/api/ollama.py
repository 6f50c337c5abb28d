"""Ollama's API on the same port, so Ollama clients work unchanged: parse, hand to
:mod:`model_boss.services.ollama`, answer. Errors on these routes leave in Ollama's envelope
(:func:`ollama_error_body`); the API key is the user key (``api_key``), not the admin one."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ..errors import BadRequest, ModelNotFound
from ..services.ollama import pulls, service
from ..services.ollama.models import ps, show, tags
from ..services.ollama.schemas import (
    OllamaChatRequest,
    OllamaDeleteRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaPullRequest,
    OllamaShowRequest,
)
from ..tenancy.keys import identity_of, sees
from .context import coordinator_of, disconnect_watch, to_response
from .errors import OllamaError, documented, error_message
from .pulls import ndjson

router = APIRouter(tags=["ollama"], responses=documented(OllamaError))
# the routes whose requests wait in the queue (the rest manage models)
QUEUED_PATHS = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"})
DATA_PATHS = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"})
OLLAMA_PATHS = DATA_PATHS | {"/api/version", "/api/tags", "/api/ps", "/api/show",
                             "/api/pull", "/api/delete", *service.MANIFEST_ONLY}
ADMIN_PATHS = frozenset({"/api/pull", "/api/delete"})  # Ollama's routes that need the admin key


def is_ollama_path(path: str) -> bool:
    return path in OLLAMA_PATHS or path.startswith("/api/blobs/")


@router.get("/api/version")
async def version() -> dict[str, Any]:
    return {"version": service.OLLAMA_VERSION}


@router.get("/api/tags")
async def list_tags(request: Request) -> dict[str, Any]:
    """Every manifest (its aliases answer too) the key may use."""
    return _seen(request, tags(coordinator_of(request)))


@router.get("/api/ps")
async def list_loaded(request: Request) -> dict[str, Any]:
    """Models with a worker: size, VRAM leased, keep-alive deadline, processor split."""
    return _seen(request, ps(coordinator_of(request)))


def _seen(request: Request, listed: dict[str, Any]) -> dict[str, Any]:
    """``listed`` without the models outside the key's scope."""
    identity = identity_of(request.scope)
    return {"models": [m for m in listed["models"]
                       if sees(identity, [m["name"], *m.get("aliases", [])])]}


@router.post("/api/show")
async def show_model(request: Request, body: OllamaShowRequest) -> dict[str, Any]:
    coord = coordinator_of(request)
    if not body.wanted:
        raise BadRequest("model: Field required", param="model", code="missing_field")
    _, entries = service.resolve(coord, body.wanted)
    if not sees(identity_of(request.scope), entries[0].manifest.names):
        raise ModelNotFound(f"model '{body.wanted}' not found", param="model")
    return show(entries[0])


@router.post("/api/chat")
async def chat(request: Request, body: OllamaChatRequest) -> Response:
    async with disconnect_watch(request) as gone:
        served = await service.chat(coordinator_of(request), body, request.headers,
                                 identity_of(request.scope), gone)
    return to_response(served)


@router.post("/api/generate")
async def generate(request: Request, body: OllamaGenerateRequest) -> Response:
    async with disconnect_watch(request) as gone:
        served = await service.generate(coordinator_of(request), body, request.headers,
                                 identity_of(request.scope), gone)
    return to_response(served)


@router.post("/api/embed")
async def embed(request: Request, body: OllamaEmbedRequest) -> dict[str, Any]:
    async with disconnect_watch(request) as gone:
        return await service.embed(coordinator_of(request), body, request.headers,
                                 identity_of(request.scope), gone)


@router.post("/api/embeddings")
async def embeddings(request: Request, body: OllamaEmbeddingsRequest) -> dict[str, Any]:
    async with disconnect_watch(request) as gone:
        return await service.embed(coordinator_of(request), body, request.headers,
                                 identity_of(request.scope), gone)


@router.post("/api/pull")
async def pull(request: Request, body: OllamaPullRequest) -> Any:
    """A hub GGUF (``hf.co/ORG/REPO:QUANT``) into the models folder, with Ollama's progress
    lines; a model already served answers success at once. Admin key."""
    coord = coordinator_of(request)
    name = pulls.check(coord, body.wanted)
    lines = pulls.pull_lines(coord, name)
    if not body.stream:
        return [line async for line in lines][-1]
    return StreamingResponse(ndjson(lines, on_error=lambda exc: {"error": exc.message}),
                             media_type="application/x-ndjson")


@router.delete("/api/delete")
@router.post("/api/delete", include_in_schema=False)
async def delete(request: Request, body: OllamaDeleteRequest) -> Response:
    """Delete a discovered or pulled model's files; a manifest's model is refused. Admin key."""
    if not body.wanted:
        raise BadRequest("model: Field required", param="model", code="missing_field")
    await coordinator_of(request).pulls.remove(body.wanted)
    return Response(status_code=200)


@router.api_route("/api/push", methods=["POST"])
@router.api_route("/api/create", methods=["POST"])
@router.api_route("/api/copy", methods=["POST"])
@router.api_route("/api/blobs/{digest}", methods=["HEAD", "POST"], include_in_schema=False)
async def manifest_only(request: Request) -> Response:
    """Models are not pushed, created or copied here: they are files and manifests."""
    route = "/api/blobs" if request.url.path.startswith("/api/blobs/") else request.url.path
    raise service.refused(route)


def ollama_error_body(_status: int, raw: bytes) -> bytes:
    """``{"error": {"message": ...}}`` (or any error body) as ``{"error": "..."}``."""
    return orjson.dumps({"error": error_message(raw)})
