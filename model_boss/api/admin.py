"""Admin surface: health, status, model load/unload/pin, config, tasks, events (SSE), metrics,
the cluster's members."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from ..backends.llama.report import draft_figures
from ..observability.refresh import refresh_metrics
from ..runtime_config import RuntimeValues
from ..scheduling.waiting import waiting_list
from ..slots.slot import SlotState
from ..tenancy.keys import identity_of, sees
from .context import coordinator_of
from .errors import OpenAIError, documented
from .status_document import status_document

router = APIRouter(tags=["admin"], responses=documented(OpenAIError))


@router.get("/health")
async def health(request: Request, response: Response) -> dict[str, Any]:
    """200 ``status: ok`` while serving; 503 ``status: draining`` (with ``Retry-After``) once
    a stop has begun, so a load balancer or healthcheck takes the daemon out at once. With
    keys, the ready models are named only to a key (those in its scope); anyone else is told
    the counts."""
    coord = coordinator_of(request)
    ready = sorted({s.model_id for s in coord.pool.slots.values() if s.state == SlotState.READY})
    answer: dict[str, Any] = {"status": "ok", "models": len(coord.catalog),
                              "ready_count": len(ready)}
    identity = identity_of(request.scope)
    if not coord.keys.enforced or (identity is not None and identity.keyed):
        names = {entry.manifest.id: entry.manifest.names for entry in coord.catalog}
        answer["ready"] = [model for model in ready if sees(identity, names.get(model, [model]))]
    drain = coord.drain
    if drain.draining:
        response.status_code = 503
        response.headers.update(drain.refusal().headers())
        answer.update(status="draining", draining={
            "since": drain.since, "grace_s": drain.grace_s, "running": drain.running(),
            "forced": drain.forced})
    return answer


@router.get("/api/v1/status")
async def status(request: Request) -> dict[str, Any]:
    return await status_document(coordinator_of(request),
                                 request.app.state.realtime_sessions.status())


@router.get("/api/v1/queue")
async def queue(request: Request,
                limit: int | None = Query(default=None, ge=1, le=10_000,
                                          description="rows in the page (default: all)"),
                offset: int = Query(default=0, ge=0, description="rows to skip")
                ) -> dict[str, Any]:
    """The waiting requests in the order they will be served (position 1 = next), a page
    at a time: ``limit`` rows from position ``offset + 1``; ``total`` says how many wait."""
    queue = coordinator_of(request).queue
    return {"total": queue.depth, "offset": offset,
            "waiting": waiting_list(queue, limit, offset)}


@router.get("/api/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """Every manifest with its slot as it is now (state, tier, lease, placement, requests)."""
    coord = coordinator_of(request)
    slots = {slot["key"]: slot for slot in coord.pool.status()}
    replicas: dict[str, list[dict[str, Any]]] = {}
    for slot in slots.values():  # a model's copies, the first first (docs/SCHEDULING.md)
        replicas.setdefault(slot["model"], []).append(slot)
    return {"models": [
        {"id": e.manifest.id, "aliases": list(e.manifest.aliases), "source": e.manifest.source,
         "path": str(e.path) if e.path else None, "available": e.available,
         "unavailable_reason": e.unavailable_reason, "slot": slots.get(e.manifest.id),
         "replicas": sorted(replicas.get(e.manifest.id, []), key=lambda s: s["replica"])}
        for e in coord.catalog]}


@router.get("/api/v1/models/{model_id:path}/status")
async def model_status(request: Request, model_id: str) -> dict[str, Any]:
    """The model's slot (an adapter's: its base's), its prompt caches, and with a draft
    model the draft's work as its worker counts it (``draft_figures``; null before any)."""
    coord = coordinator_of(request)
    model = coord.catalog.base_of(coord.catalog.get(model_id).manifest.id)
    slot = coord.pool.slot(model)
    status = {**slot.to_dict(), "prompt_cache": coord.pool.prompt_cache.stats(model)}
    if slot.entry.manifest.draft:
        report = await slot.backend.report() if slot.backend and slot.state == "ready" else {}
        status["draft_figures"] = draft_figures(report.get("metrics") or {})
    return status


@router.delete("/api/v1/models/{model_id:path}/cache")
async def clear_prompt_cache(request: Request, model_id: str) -> dict[str, Any]:
    """Remove the model's saved prompt caches (every shelf: all its settings)."""
    coord = coordinator_of(request)
    model = coord.catalog.get(model_id).manifest.id
    return {"model": model, **coord.pool.prompt_cache.clear(model)}


@router.post("/api/v1/models/{model_id:path}/load")
async def load_model(request: Request, model_id: str,
                     priority: int | None = Query(
                         default=None, ge=0, le=100,
                         description="for eviction decisions; the default priority if unset")
                     ) -> dict[str, Any]:
    """Load (or onload) a model; joins a load already in flight for it."""
    coord = coordinator_of(request)
    entry = coord.catalog.get_available(model_id)
    slot = await coord.pool.ensure_ready(
        entry.manifest.id, coord.settings.default_priority if priority is None else priority)
    coord.queue.wake()
    return slot.to_dict()


WAIT_S = Query(default=0.0, ge=0, le=600,
               description="wait this long for running requests to finish (no new ones are "
                           "granted meanwhile); 0: answer 409 model_busy at once if busy")


@router.post("/api/v1/models/{model_id:path}/unload")
async def unload_model(request: Request, model_id: str,
                       wait_s: float = WAIT_S) -> dict[str, Any]:
    """Stop a model's worker (disk tier) and release its VRAM lease."""
    coord = coordinator_of(request)
    entry = coord.catalog.get(model_id)
    unloaded = await coord.pool.unload(entry.manifest.id, wait_s=wait_s)
    return {"model": entry.manifest.id, "unloaded": unloaded}


@router.post("/api/v1/models/{model_id:path}/offload")
async def offload_model(request: Request, model_id: str,
                        wait_s: float = WAIT_S) -> dict[str, Any]:
    """Park a model's weights in CPU RAM (its worker stays up, its VRAM lease is released)."""
    coord = coordinator_of(request)
    entry = coord.catalog.get_available(model_id)
    offloaded = await coord.pool.offload(entry.manifest.id, wait_s=wait_s)
    return {"model": entry.manifest.id, "offloaded": offloaded,
            "tier": coord.pool.slot(entry.manifest.id).tier}


@router.post("/api/v1/models/{model_id:path}/pin")
async def pin_model(request: Request, model_id: str) -> dict[str, Any]:
    return _set_pin(request, model_id, True)


@router.post("/api/v1/models/{model_id:path}/unpin")
async def unpin_model(request: Request, model_id: str) -> dict[str, Any]:
    return _set_pin(request, model_id, False)


def _set_pin(request: Request, model_id: str, pinned: bool) -> dict[str, Any]:
    coord = coordinator_of(request)
    return coord.pool.set_pinned(coord.catalog.get(model_id).manifest.id, pinned).to_dict()


@router.get("/api/v1/events", response_class=Response,
            responses={200: {"content": {"text/event-stream": {}, "application/json": {}}}})
async def events(request: Request,
                 since: int = Query(default=0, description="only events after this seq"),
                 stream: bool = Query(default=True, description="false: the recent ones as JSON")
                 ) -> Response:
    """Server-sent events: the recent ones (``?since=seq``), then live ones."""
    coord = coordinator_of(request)
    if not stream:
        return Response(orjson.dumps({"events": [e for e in coord.events.recent()
                                                  if e["seq"] > since]}),
                        media_type="application/json")

    async def feed() -> AsyncIterator[bytes]:
        queue = coord.events.subscribe()
        try:
            for event in coord.events.recent():
                if event["seq"] > since:
                    yield b"data: " + orjson.dumps(event) + b"\n\n"
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), 15.0)
                    yield b"data: " + orjson.dumps(event) + b"\n\n"
                except TimeoutError:
                    yield b": keep-alive\n\n"
        finally:
            coord.events.unsubscribe(queue)

    return StreamingResponse(feed(), media_type="text/event-stream")


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request) -> Response:
    coord = coordinator_of(request)
    await refresh_metrics(coord.metrics, coord.queue, coord.boss, coord.pool, coord.settings)
    return Response(coord.metrics.render(), headers={"content-type": coord.metrics.content_type})


@router.get("/api/v1/config")
async def get_config(request: Request) -> dict[str, Any]:
    return coordinator_of(request).runtime.values.wire()


@router.put("/api/v1/config")
async def put_config(request: Request, patch: RuntimeValues) -> dict[str, Any]:
    """Change runtime toggles; only the fields given change."""
    coord = coordinator_of(request)
    values = await coord.runtime.update(patch.model_dump(by_alias=True, exclude_unset=True))
    coord.events.emit("config_changed", **values)
    return values


@router.post("/api/v1/reload")
async def reload_catalog(request: Request) -> dict[str, Any]:
    """Read the manifests, the tasks file and the models folder again; no restart. A file
    that fails to parse changes nothing: ``errors`` names it (and the field)."""
    return await coordinator_of(request).reload("api")


@router.get("/api/v1/tasks")
async def list_tasks(request: Request) -> dict[str, Any]:
    return {"tasks": coordinator_of(request).tasks.to_list()}


@router.get("/api/v1/cluster", tags=["cluster"])
async def cluster(request: Request) -> dict[str, Any]:
    """The members sharing this coordinator's Redis, and where each model is (which member,
    which state and tier)."""
    coord = coordinator_of(request)
    if coord.cluster is None:
        return {"enabled": False, "host_id": None, "members": [], "models": {}}
    return await coord.cluster.describe()
