"""OpenAI's videos API over jobs: ``POST /v1/videos`` answers at once with a queued video;
``GET /v1/videos/{id}`` its status and progress; ``GET /v1/videos/{id}/content`` the MP4;
``DELETE`` cancels a video still being made, or removes a finished one's file;
``GET /v1/videos`` lists the caller's."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from ...errors import BadRequest, NotFound
from ...jobs import Job
from ...jobs.job import FINISHED, JobStatus
from ...services import VideoRequest, accept_job, submitted
from ...services.media.forms import VIDEO_FILES
from ...services.media.videos import VIDEOS, job_id_of, video_object
from ...tenancy.keys import identity_of
from ..context import coordinator_of
from ..errors import OpenAIError, documented
from ..jobs import own_job, visible_job
from .forms import read_body

router = APIRouter(tags=["openai"], responses=documented(OpenAIError))
VIDEO_FORM = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": VideoRequest.model_json_schema()},
    "application/json": {"schema": VideoRequest.model_json_schema()}}}}


@router.post(VIDEOS, openapi_extra=VIDEO_FORM)
async def create_video(request: Request) -> JSONResponse:
    """A clip from ``prompt`` (``seconds`` long, ``size``; ``input_reference`` for an
    image-to-video model), made as a job: checked now (a bad picture, an unknown model, a
    clip longer than the model makes are answered at once), made when its turn comes."""
    coord = coordinator_of(request)
    fields = await read_body(request, VIDEO_FILES)
    body, client_id = await accept_job(coord, VIDEOS, fields, request.headers,
                                       identity_of(request.scope), None)
    job = await submitted(coord, VIDEOS, body, client_id)
    return JSONResponse(video_object(job, coord.settings.job_result_ttl_s),
                        headers={"location": f"{VIDEOS}/{video_object(job, 0)['id']}"})


@router.get(VIDEOS)
async def list_videos(request: Request, limit: int = Query(default=20, ge=1, le=100),
                      order: Literal["asc", "desc"] = "desc",
                      after: str | None = None) -> dict[str, Any]:
    """The caller's videos, newest first (``order=asc``: oldest), paged after ``after``."""
    coord = coordinator_of(request)
    jobs = sorted((j for j in await coord.jobs.store.list(None)
                   if j.endpoint == VIDEOS and visible_job(request, j)),
                  key=lambda j: j.created_at, reverse=order == "desc")
    videos = [video_object(j, coord.settings.job_result_ttl_s) for j in jobs]
    if after is not None:
        ids = [v["id"] for v in videos]
        videos = videos[ids.index(after) + 1:] if after in ids else []
    page = videos[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(videos) > limit}


@router.get(VIDEOS + "/{video_id}")
async def retrieve_video(request: Request, video_id: str) -> dict[str, Any]:
    coord = coordinator_of(request)
    return video_object(await _video(request, video_id), coord.settings.job_result_ttl_s)


@router.get(VIDEOS + "/{video_id}/content", response_class=Response,
            responses={200: {"content": {"video/mp4": {}}}})
async def video_content(request: Request, video_id: str,
                        variant: Literal["video"] = "video") -> Response:
    """The finished clip (MP4). A video not finished yet is a 400 that says its status."""
    job = await _video(request, video_id)
    if job.status is not JobStatus.SUCCEEDED:
        raise BadRequest(f"video '{video_id}' is {video_object(job, 0)['status']}: its content "
                         "is there once it is completed", param="video_id",
                         code="video_not_ready")
    data = coordinator_of(request).video_files.read(job.id)
    return Response(data, media_type="video/mp4",
                    headers={"content-disposition": f'inline; filename="{video_id}.mp4"'})


@router.delete(VIDEOS + "/{video_id}")
async def delete_video(request: Request, video_id: str) -> dict[str, Any]:
    """A video still queued or being made is cancelled (its slot and lease let go at the
    next denoising step); a finished one's file is removed."""
    coord = coordinator_of(request)
    job = await _video(request, video_id)
    if job.status not in FINISHED:
        job = await coord.jobs.cancel(job.id)
    coord.video_files.remove(job.id)
    return {"id": video_object(job, 0)["id"], "object": "video.deleted", "deleted": True}


async def _video(request: Request, video_id: str) -> Job:
    """The caller's video job ``video_id``; another key's, an unknown id or a job that is
    not a video: the same 404."""
    try:
        job = await own_job(request, job_id_of(video_id))
    except NotFound:
        job = None
    if job is None or job.endpoint != VIDEOS:
        raise NotFound(f"video '{video_id}' does not exist (or has expired)",
                       param="video_id", code="video_not_found")
    return job
