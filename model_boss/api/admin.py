"""Admin surface: health, status, model load/unload/pin, config, tasks, events (SSE), metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ..errors import BadRequest
from ..inference import SlotState
from .context import coordinator_of

router = APIRouter(tags=["admin"])


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    coord = coordinator_of(request)
    return {"status": "ok", "models": len(coord.catalog),
            "ready": [s.model_id for s in coord.pool.slots.values()
                      if s.state == SlotState.READY]}


@router.get("/api/v1/status")
async def status(request: Request) -> dict[str, Any]:
    return await coordinator_of(request).status()


@router.get("/api/v1/models/{model_id:path}/status")
async def model_status(request: Request, model_id: str) -> dict[str, Any]:
    coord = coordinator_of(request)
    return coord.pool.slot(coord.catalog.get(model_id).manifest.id).to_dict()


@router.post("/api/v1/models/{model_id:path}/load")
async def load_model(request: Request, model_id: str) -> dict[str, Any]:
    coord = coordinator_of(request)
    entry = coord.catalog.get_available(model_id)
    priority = int(request.query_params.get("priority", coord.settings.default_priority))
    slot = await coord.pool.get_or_load(entry.manifest.id, priority)
    coord.queue.wake()
    return slot.to_dict()


@router.post("/api/v1/models/{model_id:path}/unload")
async def unload_model(request: Request, model_id: str) -> dict[str, Any]:
    coord = coordinator_of(request)
    entry = coord.catalog.get(model_id)
    unloaded = await coord.pool.unload(entry.manifest.id)
    return {"model": entry.manifest.id, "unloaded": unloaded}


@router.post("/api/v1/models/{model_id:path}/pin")
async def pin_model(request: Request, model_id: str) -> dict[str, Any]:
    return _set_pin(request, model_id, True)


@router.post("/api/v1/models/{model_id:path}/unpin")
async def unpin_model(request: Request, model_id: str) -> dict[str, Any]:
    return _set_pin(request, model_id, False)


def _set_pin(request: Request, model_id: str, pinned: bool) -> dict[str, Any]:
    coord = coordinator_of(request)
    slot = coord.pool.slot(coord.catalog.get(model_id).manifest.id)
    slot.pinned = pinned
    slot.refresh_unload_at()
    coord.events.emit("pinned" if pinned else "unpinned", model=slot.model_id)
    return slot.to_dict()


@router.get("/api/v1/events")
async def events(request: Request) -> Response:
    """Server-sent events: the recent ones (``?since=seq``), then live ones."""
    coord = coordinator_of(request)
    try:
        since = int(request.query_params.get("since", "0"))
    except ValueError as exc:
        raise BadRequest("since must be an integer", param="since") from exc
    if request.query_params.get("stream", "true").lower() in ("0", "false", "no"):
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


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    coord = coordinator_of(request)
    await coord.refresh_metrics()
    return Response(coord.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/api/v1/config")
async def get_config(request: Request) -> dict[str, Any]:
    return coordinator_of(request).runtime.values.wire()


@router.put("/api/v1/config")
async def put_config(request: Request) -> dict[str, Any]:
    coord = coordinator_of(request)
    try:
        patch = orjson.loads(await request.body() or b"null")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    values = await coord.runtime.update(patch)
    coord.events.emit("config_changed", **values)
    return values


@router.get("/api/v1/tasks")
async def list_tasks(request: Request) -> dict[str, Any]:
    return {"tasks": coordinator_of(request).tasks.to_list()}
