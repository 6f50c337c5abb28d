"""Async jobs: ``POST /api/v1/jobs`` → 202 + id; poll, list, cancel."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..coordinator import Coordinator
from ..errors import JobNotFound
from ..jobs import Job
from ..scheduling.waiting import queue_place
from ..services import ENDPOINT_BODIES, accept_job, job_key, submitted
from ..tenancy.keys import identity_of
from .context import coordinator_of
from .errors import OpenAIError, documented

router = APIRouter(tags=["jobs"], responses=documented(OpenAIError))

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                   "/v1/rerank", "/v1/audio/speech", "/v1/images/generations",
                   "/v1/images/edits", "/v1/videos"]
assert set(Endpoint.__args__) == set(ENDPOINT_BODIES)  # type: ignore[attr-defined]


class JobRequest(BaseModel):
    """``POST /api/v1/jobs``: the endpoint to run and its body, checked at once."""

    endpoint: Endpoint
    body: dict[str, Any] = Field(description="the body that endpoint takes, x_* fields too")
    client_id: str | None = Field(default=None, min_length=1, max_length=200,
                                  description="else x_client_id or X-Client-Id")


@router.post("/api/v1/jobs", status_code=202)
async def submit_job(request: Request, payload: JobRequest) -> JSONResponse:
    """Checked as the live request would be before it is taken (on the member that takes
    it, in a cluster): a bad body, ``stream: true``, an unknown model or task are answered
    now (400, 404), not failed later."""
    coord = coordinator_of(request)
    body, client_id = await accept_job(coord, payload.endpoint, payload.body,
                                       request.headers, identity_of(request.scope),
                                       payload.client_id)
    job = await submitted(coord, payload.endpoint, body, client_id)
    return JSONResponse(job.public(), status_code=202,
                        headers={"location": f"/api/v1/jobs/{job.id}"})


@router.get("/api/v1/jobs")
async def list_jobs(request: Request,
                    client_id: str | None = Query(default=None, max_length=200)
                    ) -> dict[str, Any]:
    coord = coordinator_of(request)
    jobs = [j for j in await coord.jobs.store.list(client_id) if visible_job(request, j)]
    return {"jobs": [await _view(coord, j) for j in sorted(jobs, key=lambda j: j.created_at)]}


@router.get("/api/v1/jobs/{job_id}")
async def get_job(request: Request, job_id: str) -> dict[str, Any]:
    """The job; while it waits, its ``queue_position`` (1 = next) and ``estimated_start``."""
    coord = coordinator_of(request)
    return await _view(coord, await own_job(request, job_id))


@router.delete("/api/v1/jobs/{job_id}")
async def cancel_job(request: Request, job_id: str) -> dict[str, Any]:
    coord = coordinator_of(request)
    await own_job(request, job_id)
    return await _view(coord, await coord.jobs.cancel(job_id))


def visible_job(request: Request, job: Job) -> bool:
    """An admin (or a box without keys) sees every job; a user key only the jobs it gave."""
    identity = identity_of(request.scope)
    return identity is None or identity.admin or job_key(job) == identity.key


async def own_job(request: Request, job_id: str) -> Job:
    """The job ``job_id`` if the caller may see it; another key's job does not exist for
    it (the same 404 as an unknown id)."""
    job = await coordinator_of(request).jobs.get(job_id)
    if not visible_job(request, job):
        raise JobNotFound(job_id)
    return job


async def _view(coord: Coordinator, job: Job) -> dict[str, Any]:
    """A job as answered: its record, and its place in this coordinator's queue."""
    return {**job.public(), **await queue_place(coord.queue, job.id)}
