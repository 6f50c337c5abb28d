"""Clips: ``POST /v1/videos`` is a job (a clip takes minutes); the job serves the request on
a video model's slot, keeps the MP4 on disk (``videos_mb``) and answers its figures. A job
is shown in OpenAI's video object shape: ``queued`` → ``in_progress`` (``progress`` in
percent of the denoising steps) → ``completed`` or ``failed``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ...backends.diffusers import VIDEO_HEADER
from ...endpoints import VIDEOS
from ...jobs import Job
from ...jobs.job import JobStatus
from ...jobs.runner import Dispatched
from ..extensions import Extensions
from ..schemas import VideoRequest
from ..served import Served
from ..serving import serve
from .pictures import from_text, open_picture, png_text

if TYPE_CHECKING:
    from ...coordinator import Coordinator

ID_PREFIX = "video_"
DEFAULT_SIZE = "832x480"  # Wan's and most video models' 480p, landscape
_STATUS = {JobStatus.QUEUED: "queued", JobStatus.LOADING: "queued",
           JobStatus.RUNNING: "in_progress", JobStatus.SUCCEEDED: "completed",
           JobStatus.FAILED: "failed", JobStatus.CANCELLED: "failed"}


def video_body(request: VideoRequest, max_side: int) -> dict[str, Any]:
    """The clip in the diffusers worker's terms (``frames`` follow from ``seconds`` and the
    model's frame rate, in the backend); the starting picture checked and as a PNG."""
    width, height = (int(side) for side in (request.size or DEFAULT_SIZE).split("x"))
    body: dict[str, Any] = {"prompt": request.prompt, "width": width, "height": height}
    if request.input_reference is not None:
        picture = open_picture(from_text(request.input_reference, "input_reference"),
                               "input_reference", max_side)
        body["image"] = png_text(picture)
    for name in ("model", "seconds", "fps", "steps", "seed", "guidance", "negative_prompt"):
        if (value := getattr(request, name)) is not None:
            body[name] = value
    return body


async def make_video(coord: Coordinator, job: Job, request: VideoRequest, ext: Extensions,
                     on_dispatch: Dispatched) -> Served:
    """Serve a video job: the clip kept as the job's file, its figures as the result."""
    served = await serve(coord, VIDEOS, video_body(request, coord.settings.max_image_side), ext,
                         on_dispatch=on_dispatch)
    if served.status != 200 or served.chunks is not None:
        return served
    coord.video_files.save(job.id, served.body)
    try:
        figures = orjson.loads(served.headers.get(VIDEO_HEADER) or "{}")
    except orjson.JSONDecodeError:
        figures = {}
    result = {"file": f"{job.id}.mp4", "bytes": len(served.body), **figures}
    return Served(200, {}, "application/json", body=orjson.dumps(result))


def video_object(job: Job, ttl_s: float) -> dict[str, Any]:
    """A video job as OpenAI's ``Video``."""
    body = job.body
    progress = job.progress or {}
    done = job.status is JobStatus.SUCCEEDED
    steps = progress.get("steps")
    percent = 100 if done else (int(100 * progress.get("step", 0) / steps)
                                if isinstance(steps, int) and steps > 0 else 0)
    error = None
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        error = job.error or {"code": "cancelled", "message": "the video was cancelled"}
        error = {"code": error.get("code") or "failed", "message": error.get("message", "")}
    seconds = body.get("seconds")
    return {"id": ID_PREFIX + job.id, "object": "video", "model": job.model or body.get("model"),
            "status": _STATUS[job.status], "progress": min(100, percent),
            "created_at": int(job.created_at),
            "completed_at": int(job.finished_at) if done and job.finished_at else None,
            "expires_at": int(job.finished_at + ttl_s) if job.finished_at else None,
            "prompt": body.get("prompt"), "seconds": f"{seconds:g}" if seconds else "4",
            "size": body.get("size") or DEFAULT_SIZE, "error": error,
            "remixed_from_video_id": None}


def job_id_of(video_id: str) -> str:
    """The job behind a video id (``video_<job id>``; a bare job id answers too)."""
    return video_id.removeprefix(ID_PREFIX)
