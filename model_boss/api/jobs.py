"""Async jobs: ``POST /api/v1/jobs`` → 202 + id; poll, list, cancel."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..coordinator import Coordinator
from ..errors import BadRequest
from ..inference import SlotState, SlotTicket
from ..jobs import Job, JobManager, JobStatus
from . import images, openai
from .proxy import coordinator_of, serve
from .requests import pop_extensions

router = APIRouter()

VALIDATORS = {
    "/v1/chat/completions": openai.validate_chat,
    "/v1/completions": openai.validate_completion,
    "/v1/embeddings": openai.validate_embedding,
    "/v1/audio/speech": openai.validate_speech,
}
ENDPOINTS = (*VALIDATORS, "/v1/images/generations")


def make_runner(coord: Coordinator, base_url_of):
    """The function a JobManager runs for each job: the same path a live request takes."""

    async def run(job: Job, manager: JobManager) -> Any:
        body = dict(job.body)
        ext = pop_extensions(body, {})
        ext.client_id = ext.client_id or job.client_id
        model = body.get("model")
        entry = coord.catalog.find(model) if isinstance(model, str) else None
        slot = coord.pool.slots.get(entry.manifest.id) if entry else None
        if slot is None or slot.state != SlotState.READY:
            await manager.update(job, status=JobStatus.LOADING)
        started = time.monotonic()
        watchers: list[asyncio.Task] = []

        def dispatched(ticket: SlotTicket) -> None:
            job.model = ticket.slot.model_id
            job.timings["waited_s"] = round(time.monotonic() - started, 3)
            watchers.append(asyncio.create_task(_running(manager, job, ticket)))

        try:
            if job.endpoint == "/v1/images/generations":
                worker_body = images.image_body(body, ext)
                response = await images.generate(coord, worker_body, ext, base_url_of(),
                                                  on_dispatch=dispatched)
            else:
                body["stream"] = False
                response = await serve(coord, job.endpoint, body, ext, on_dispatch=dispatched)
        finally:
            for watcher in watchers:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
        job.timings["run_s"] = round(time.monotonic() - started - job.timings.get(
            "waited_s", 0.0), 3)
        if response.media_type and "json" not in response.media_type:
            return {"content_type": response.media_type,
                    "b64": base64.b64encode(response.body).decode()}
        return orjson.loads(response.body)

    return run


async def _running(manager: JobManager, job: Job, ticket: SlotTicket) -> None:
    """Mark the job running and, where the worker reports progress, follow it."""
    await manager.update(job, status=JobStatus.RUNNING)
    progress = getattr(ticket.slot.backend, "progress", None)
    if progress is None:
        return
    while True:
        await asyncio.sleep(0.2)
        report = await progress()
        if report and report != job.progress:
            await manager.update(job, progress=report)


@router.post("/api/v1/jobs", status_code=202)
async def submit_job(request: Request) -> JSONResponse:
    coord = coordinator_of(request)
    try:
        payload = orjson.loads(await request.body() or b"null")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    endpoint, body = payload.get("endpoint"), payload.get("body")
    if endpoint not in ENDPOINTS:
        raise BadRequest(f"'endpoint' must be one of {list(ENDPOINTS)}", param="endpoint")
    if not isinstance(body, dict):
        raise BadRequest("'body' must be a JSON object", param="body")
    probe = dict(body)  # validate now so a bad body is a 400, not a failed job
    ext = pop_extensions(probe, request.headers)
    if endpoint == "/v1/images/generations":
        images.image_body(probe, ext)
    else:
        VALIDATORS[endpoint](probe)
    client_id = ext.client_id or payload.get("client_id") or "anonymous"
    job = await coord.jobs.submit(endpoint, body, str(client_id))
    return JSONResponse(job.public(), status_code=202,
                        headers={"location": f"/api/v1/jobs/{job.id}"})


@router.get("/api/v1/jobs")
async def list_jobs(request: Request) -> dict[str, Any]:
    coord = coordinator_of(request)
    jobs = await coord.jobs.store.list(request.query_params.get("client_id"))
    return {"jobs": [j.public() for j in sorted(jobs, key=lambda j: j.created_at)]}


@router.get("/api/v1/jobs/{job_id}")
async def get_job(request: Request, job_id: str) -> dict[str, Any]:
    return (await coordinator_of(request).jobs.get(job_id)).public()


@router.delete("/api/v1/jobs/{job_id}")
async def cancel_job(request: Request, job_id: str) -> dict[str, Any]:
    return (await coordinator_of(request).jobs.cancel(job_id)).public()
