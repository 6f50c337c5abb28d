"""Ollama's API over the serving service: chat, generate and embeddings are translated into
the OpenAI-compatible requests the workers take and served through the same router, queue,
leases, keep-alive and error rules as ``/v1/*``; their answers are translated back (whole,
or NDJSON as they stream). Model names resolve through manifests, aliases and tasks."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ...catalog import CatalogEntry
from ...catalog.tasks import task_name
from ...errors import BadRequest
from ...tenancy.keys import Identity
from ..cancel import Departure
from ..extensions import Extensions, pop_extensions
from ..served import WAIT_HEADER, Served
from ..serving import CHAT, LOAD_ONLY, serve
from .models import context_per_request
from .schemas import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaMessage,
)
from .stream import NdjsonStream, Shape
from .translate import (
    chat_message,
    created_at,
    final_fields,
    format_params,
    no_vision,
    openai_messages,
    parse_keep_alive,
    resolve_name,
    tools_param,
    worker_params,
)

if TYPE_CHECKING:
    from ...coordinator import Coordinator

OLLAMA_VERSION = "0.12.0"  # the Ollama API these routes follow
COMPLETIONS, EMBEDDINGS = "/v1/completions", "/v1/embeddings"
NDJSON, JSON = "application/x-ndjson", "application/json"
UNLOAD_WAIT_S = 60.0  # keep_alive 0 on a busy model: running requests may finish first
MANIFEST_ONLY = {"/api/push": "pushed", "/api/create": "created", "/api/copy": "copied",
                 "/api/blobs": "uploaded"}


def refused(route: str) -> BadRequest:
    """The answer to Ollama's model-making routes: model-boss's models are files."""
    done = MANIFEST_ONLY.get(route, "changed")
    return BadRequest(f"models cannot be {done} through model-boss: a model is a file in the "
                      "models folder (or a manifest naming one), or one pulled with "
                      "/api/pull hf.co/ORG/REPO:QUANT; GET /api/tags lists them",
                      code="models_come_from_files")


def extensions(request: Any, headers: Mapping[str, str], identity: Identity | None,
               ) -> Extensions:
    """The ``x_*`` fields and headers, as on the OpenAI routes; ``keep_alive`` (when given)
    is the request's keep-alive."""
    fields = {k: v for k, v in request.model_dump(exclude_unset=True).items()
              if k.startswith("x_")}
    ext = pop_extensions(fields, headers, identity)
    keep_alive = parse_keep_alive(request.keep_alive)
    if keep_alive is not None:
        ext.keep_alive_s = keep_alive
    return ext


def resolve(coord: Coordinator, name: str) -> tuple[str, list[CatalogEntry]]:
    """The catalog name (or ``task:<name>``) an Ollama model name stands for, and the
    entries it may be served by; 404 when it is neither a model nor a task."""
    def known(candidate: str) -> bool:
        task = task_name(candidate)
        return candidate in coord.catalog if task is None else task in coord.tasks

    resolved = resolve_name(name, known)
    task = task_name(resolved)
    if task is None:
        return resolved, [coord.catalog.get(resolved)]
    return resolved, [coord.catalog.get(m) for m in coord.tasks.get(task).candidates]


def _worker_params(request: Any, entries: list[CatalogEntry]) -> dict[str, Any]:
    entry = min(entries, key=context_per_request)
    return worker_params(request.options, context_per_request(entry), entry.manifest.id)


def _vision(entries: list[CatalogEntry]) -> bool:
    return all(e.manifest.sees_images for e in entries)


def _think(ext: Extensions, think: bool | str | None) -> None:
    if ext.thinking is None and think is not None:
        ext.thinking = think if isinstance(think, bool) else think != "none"


async def chat(coord: Coordinator, request: OllamaChatRequest, headers: Mapping[str, str],
               identity: Identity | None, disconnected: Departure | None = None) -> Served:
    started = time.monotonic()
    ext = extensions(request, headers, identity)
    name, entries = resolve(coord, request.model)
    if not request.messages:
        return await load_or_unload(coord, name, entries, request.model, ext, "chat",
                                    request.stream, disconnected)
    body = {"model": name, "stream": request.stream,
            "messages": openai_messages(request.messages, vision=_vision(entries),
                                        model_id=entries[0].manifest.id),
            **_worker_params(request, entries), **format_params(request.format, chat=True),
            **tools_param(request.tools)}
    _think(ext, request.think)
    return await _served(coord, CHAT, body, ext, "chat", request.model, started, disconnected)


async def generate(coord: Coordinator, request: OllamaGenerateRequest,
                   headers: Mapping[str, str], identity: Identity | None,
                   disconnected: Departure | None = None) -> Served:
    started = time.monotonic()
    ext = extensions(request, headers, identity)
    name, entries = resolve(coord, request.model)
    if not request.prompt and not request.images:
        return await load_or_unload(coord, name, entries, request.model, ext, "generate",
                                    request.stream, disconnected)
    for field, why in (("suffix", "fill-in-the-middle: use llama.cpp's /infill route"),
                       ("template", "the chat template is the manifest's (chat_template)"),
                       ("context", "no context tokens are returned; send the conversation "
                                   "to /api/chat")):
        if getattr(request, field):
            raise BadRequest(f"{field}: not supported ({why})", param=field)
    params = {**_worker_params(request, entries),
              **format_params(request.format, chat=not request.raw)}
    _think(ext, request.think)
    if request.raw:
        if request.images:
            raise no_vision(entries[0].manifest.id, "images")
        body = {"model": name, "prompt": request.prompt, "stream": request.stream, **params}
        return await _served(coord, COMPLETIONS, body, ext, "generate", request.model,
                             started, disconnected)
    messages = [OllamaMessage(role="system", content=request.system)] if request.system \
        else []
    messages.append(OllamaMessage(role="user", content=request.prompt or "",
                                  images=request.images))
    body = {"model": name, "stream": request.stream, **params,
            "messages": openai_messages(messages, vision=_vision(entries),
                                        model_id=entries[0].manifest.id)}
    return await _served(coord, CHAT, body, ext, "generate", request.model, started,
                         disconnected)


async def _served(coord: Coordinator, endpoint: str, body: dict[str, Any], ext: Extensions,
                  shape: Shape, shown: str, started: float,
                  disconnected: Departure | None) -> Served:
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    served = await serve(coord, endpoint, body, ext, disconnected=disconnected)
    waited = float(served.headers.get(WAIT_HEADER) or 0)
    if served.chunks is not None:
        stream = NdjsonStream(shape, shown, started, waited)
        return Served(served.status, served.headers, NDJSON,
                      chunks=stream.translate(served.chunks))
    answer = whole_answer(orjson.loads(served.body), shape, shown,
                          time.monotonic() - started, waited)
    return Served(served.status, served.headers, JSON, body=orjson.dumps(answer))


def whole_answer(data: dict[str, Any], shape: Shape, shown: str, total_s: float,
                 waited_s: float) -> dict[str, Any]:
    """A worker's whole OpenAI answer as Ollama's non-streaming one."""
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message")
    out: dict[str, Any] = {"model": shown, "created_at": created_at()}
    if shape == "chat":
        out["message"] = chat_message(message or {})
    else:
        out["response"] = (message or {}).get("content") or choice.get("text") or ""
        if message and message.get("reasoning_content"):
            out["thinking"] = message["reasoning_content"]
    return {**out, **final_fields(choice.get("finish_reason"), data.get("usage"),
                                  data.get("timings"), total_s, waited_s)}


async def load_or_unload(coord: Coordinator, name: str, entries: list[CatalogEntry],
                         shown: str, ext: Extensions, shape: Shape, stream: bool,
                         disconnected: Departure | None) -> Served:
    """Ollama's empty request: load the model through the queue (as any request would), or
    with ``keep_alive`` 0 unload it once its running requests end (a pinned model stays)."""
    headers: dict[str, str] = {}
    if ext.keep_alive_s == 0:
        reason = "unload"
        for entry in entries:  # every copy of it
            await coord.pool.unload(entry.manifest.id, "keep_alive 0", wait_s=UNLOAD_WAIT_S,
                                    only_if=lambda slot: not slot.pinned)
    else:
        reason = "load"
        headers = (await serve(coord, LOAD_ONLY, {"model": name}, ext,
                               disconnected=disconnected)).headers
    body: dict[str, Any] = {"model": shown, "created_at": created_at()}
    if shape == "chat":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body.update(done=True, done_reason=reason)
    return Served(200, headers, NDJSON if stream else JSON,
                  body=orjson.dumps(body) + (b"\n" if stream else b""))


def _inputs(request: OllamaEmbedRequest | OllamaEmbeddingsRequest) -> list[str]:
    if isinstance(request, OllamaEmbeddingsRequest):
        return [request.prompt]
    return [request.input] if isinstance(request.input, str) else list(request.input)


async def embed(coord: Coordinator, request: OllamaEmbedRequest | OllamaEmbeddingsRequest,
                headers: Mapping[str, str], identity: Identity | None,
                disconnected: Departure | None = None) -> dict[str, Any]:
    """``/api/embed`` (or, for :class:`OllamaEmbeddingsRequest`, ``/api/embeddings``):
    vectors from the worker's ``/v1/embeddings`` (llama.cpp normalises them, as Ollama's
    /api/embed does); ``dimensions`` keeps the first n of each, normalised again."""
    started = time.monotonic()
    ext = extensions(request, headers, identity)
    name, entries = resolve(coord, request.model)
    _worker_params(request, entries)  # num_ctx is checked; sampling options mean nothing here
    served = await serve(coord, EMBEDDINGS, {"model": name, "input": _inputs(request)}, ext,
                         disconnected=disconnected)
    data = orjson.loads(served.body)
    rows = sorted(data.get("data") or [], key=lambda row: row.get("index", 0))
    vectors = [row["embedding"] for row in rows]
    if isinstance(request, OllamaEmbeddingsRequest):
        return {"embedding": vectors[0] if vectors else []}
    if request.dimensions:
        vectors = [shorten(v, request.dimensions) for v in vectors]
    waited = float(served.headers.get(WAIT_HEADER) or 0)
    return {"model": request.model, "embeddings": vectors,
            "total_duration": int((time.monotonic() - started) * 1e9),
            "load_duration": int(waited * 1e9),
            "prompt_eval_count": int((data.get("usage") or {}).get("prompt_tokens", 0))}


def shorten(vector: list[float], dimensions: int) -> list[float]:
    """The first ``dimensions`` values, scaled back to unit length (as Ollama does)."""
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm else head
