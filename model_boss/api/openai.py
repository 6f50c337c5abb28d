"""The OpenAI-compatible surface: /v1/models, chat and text completions, embeddings, rerank,
speech and transcription, images (and the files ``response_format: url`` links to), the
Responses API. The routes llama-server answers in OpenAI's shape without the ``/v1`` prefix
answer here too, so clients written for it work unchanged (``/completions`` is llama.cpp's
native one, in :mod:`.llamacpp`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from ..catalog import CatalogEntry
from ..catalog.voices import clones_voices, voice_store
from ..errors import BadRequest, ModelBossError, ModelNotFound
from ..services import (
    FILES_PATH,
    IMAGES,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    ImageRequest,
    ResponsesRequest,
    SpeechRequest,
    generate_images,
    pop_extensions,
    serve_streaming,
)
from ..services.media.audio import TRANSCRIPTIONS, TRANSLATIONS, Upload, transcription_body
from ..services.redact import redact
from ..services.responses import DIALECT as RESPONSES_DIALECT
from ..services.responses import RESPONSES
from ..services.schemas import OpenAIRequest, RerankRequest
from ..services.served import Dialect
from ..slot_key import slot_key
from ..slots.slot import SlotState
from ..tenancy.keys import identity_of, sees
from . import anthropic
from .context import coordinator_of, disconnect_watch, to_response
from .errors import OpenAIError, documented

router = APIRouter(tags=["openai"], responses=documented(OpenAIError))

# the upload routes read their form themselves (the file is sized before it is read): the
# form, for the OpenAPI document
UPLOAD_FORM: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"}, "model": {"type": "string"},
        "language": {"type": "string"}, "prompt": {"type": "string"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "response_format": {"type": "string",
                            "enum": ["json", "text", "srt", "vtt", "verbose_json"]},
        "timestamp_granularities[]": {"type": "array", "items": {
            "type": "string", "enum": ["word", "segment"]}}}}}}}}


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request, limit: int = 20, after_id: str | None = None,
                      before_id: str | None = None) -> Any:
    """Every model the key may use (aliases answer too). With ``anthropic-version`` (sent by
    Anthropic's SDK), Anthropic's model list instead, paged by ``limit``, ``after_id`` and
    ``before_id`` (which OpenAI's list does not take)."""
    coord = coordinator_of(request)
    if anthropic.speaks_anthropic(request.headers):
        infos = [anthropic.model_info(e.manifest, coord.started_at) for e in _seen(request)]
        try:
            return anthropic.models_page(infos, limit, after_id, before_id)
        except ModelBossError as exc:
            return anthropic.anthropic_error(exc)
    return {"object": "list", "data": [_model_card(request, e) for e in _seen(request)]}


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def retrieve_model(request: Request, model_id: str) -> Any:
    """One model by its id or an alias (its own id answers): ``models.retrieve`` of OpenAI's
    client, or of Anthropic's with ``anthropic-version``. A model outside the key's scope is
    a 404, as one that does not exist."""
    coord = coordinator_of(request)
    entry = coord.catalog.find(model_id)
    if entry is None or not sees(identity_of(request.scope), entry.manifest.names):
        error = ModelNotFound(f"The model '{model_id}' does not exist", param="model")
        if anthropic.speaks_anthropic(request.headers):
            return anthropic.anthropic_error(error)
        raise error
    if anthropic.speaks_anthropic(request.headers):
        return anthropic.model_info(entry.manifest, coord.started_at)
    return _model_card(request, entry)


def _seen(request: Request) -> list[CatalogEntry]:
    """The catalog's models the caller's key may use (the rest are as if they did not exist)."""
    identity = identity_of(request.scope)
    return [entry for entry in coordinator_of(request).catalog
            if sees(identity, entry.manifest.names)]


def _model_card(request: Request, entry: CatalogEntry) -> dict[str, Any]:
    """A model as OpenAI's ``/v1/models`` lists it, with model-boss's own fields."""
    coord, m = coordinator_of(request), entry.manifest
    model_id = m.base or m.id  # an adapter: its base's
    slot = coord.pool.slots.get(slot_key(model_id))  # its first copy: it holds the pin
    # ready when any copy is: a second copy serves as well as the first
    ready = any(o.slot.state == SlotState.READY for o in coord.pool.replicas(model_id))
    card = {
        "id": m.id, "object": "model", "created": int(coord.started_at),
        "owned_by": "model-boss", "aliases": m.aliases, "category": str(m.category),
        "backend": str(m.backend), "source": m.source, "available": entry.available,
        "unavailable_reason": redact(entry.unavailable_reason)
        if entry.unavailable_reason else None,
        "state": str(SlotState.READY if ready else slot.state if slot else SlotState.IDLE),
        "pinned": slot.pinned if slot else m.pin,
    }
    if m.base:  # a LoRA adapter, served on its base's worker
        card["base"] = m.base
    elif clones_voices(entry.path):  # a VibeVoice: the reference voices it speaks in
        store = voice_store(coord.settings.state_path)
        card["voices"] = [v.name for v in store.voices(m.id, entry.path)]
    return card


async def serve_body(request: Request, endpoint: str, body: OpenAIRequest,
                     dialect: Dialect | None = None) -> Response:
    """Serve a parsed body on ``endpoint`` (the worker's path for it)."""
    data = body.model_dump(exclude_unset=True)
    ext = pop_extensions(data, request.headers,
                         identity_of(request.scope))
    async with disconnect_watch(request) as gone:
        served = await serve_streaming(coordinator_of(request), endpoint, data, ext,
                                       disconnected=gone, dialect=dialect)
    return to_response(served)


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request, body: ChatRequest) -> Response:
    return await serve_body(request, "/v1/chat/completions", body)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest) -> Response:
    return await serve_body(request, "/v1/completions", body)


@router.post("/v1/embeddings")
@router.post("/embeddings", include_in_schema=False)
async def embeddings(request: Request, body: EmbeddingRequest) -> Response:
    return await serve_body(request, "/v1/embeddings", body)


@router.post("/v1/rerank")
@router.post("/rerank", include_in_schema=False)
@router.post("/v1/reranking", include_in_schema=False)  # llama.cpp's server's other names
@router.post("/reranking", include_in_schema=False)
async def rerank(request: Request, body: RerankRequest) -> Response:
    """Documents ordered by relevance to the query: a ``rerank`` model (transformers'
    CrossEncoder) or a llama.cpp model with ``reranking: true``."""
    return await serve_body(request, "/v1/rerank", body)


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def responses(request: Request, body: ResponsesRequest) -> Response:
    """A response, whole or streamed: every event numbered (``sequence_number``) and indexed
    (``output_index``, ``content_index``), reasoning as ``reasoning`` items; a
    ``prompt_cache_key`` keeps a session on one llama.cpp slot where it can."""
    return await serve_body(request, RESPONSES, body, RESPONSES_DIALECT)


@router.post("/v1/audio/speech")
async def speech(request: Request, body: SpeechRequest) -> Response:
    return await serve_body(request, "/v1/audio/speech", body)


@router.post(TRANSCRIPTIONS, openapi_extra=UPLOAD_FORM)
@router.post("/audio/transcriptions", include_in_schema=False)
async def transcriptions(request: Request) -> Response:
    """Speech to text: a ``stt`` model (Whisper, Wav2Vec2, ...). ``multipart/form-data`` with
    ``file`` (wav, mp3, flac, ogg, webm, m4a, ...), ``model``, ``language``, ``prompt``,
    ``temperature``, ``response_format`` (json, text, srt, vtt, verbose_json) and
    ``timestamp_granularities[]``."""
    return await _transcribe(request, TRANSCRIPTIONS)


@router.post(TRANSLATIONS, openapi_extra=UPLOAD_FORM)
@router.post("/audio/translations", include_in_schema=False)
async def translations(request: Request) -> Response:
    """Speech in any language to English text (a Whisper model); the form of
    ``/v1/audio/transcriptions`` without ``language``."""
    return await _transcribe(request, TRANSLATIONS)


async def _transcribe(request: Request, endpoint: str) -> Response:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequest("send the audio as multipart/form-data (a 'file' part and the "
                         "other fields as form fields)", code="invalid_content_type")
    async with request.form(max_files=1, max_fields=64) as form:
        parts = [(name, Upload(value.filename, await value.read())
                  if isinstance(value, UploadFile) else value)
                 for name, value in form.multi_items()]
    data = transcription_body(parts)
    ext = pop_extensions(data, request.headers,
                         identity_of(request.scope))
    async with disconnect_watch(request) as gone:
        served = await serve_streaming(coordinator_of(request), endpoint, data, ext,
                                       disconnected=gone)
    return to_response(served)


@router.post(IMAGES)
async def images_generations(request: Request, body: ImageRequest) -> Response:
    ext = pop_extensions(body.model_dump(exclude_unset=True), request.headers,
                         identity_of(request.scope))
    async with disconnect_watch(request) as gone:
        served = await generate_images(coordinator_of(request), body, ext,
                                       str(request.base_url), disconnected=gone)
    return to_response(served)


@router.get(FILES_PATH + "{name}", response_class=Response,
            responses={200: {"content": {"image/png": {}}}})
async def image_file(request: Request, name: str) -> Response:
    path = coordinator_of(request).image_files.path(name)
    return Response(path.read_bytes(), media_type="image/png")
