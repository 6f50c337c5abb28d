"""The work behind a job: the same path a live request takes, with no caller waiting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..jobs import Job
from ..jobs.runner import Dispatched
from .extensions import pop_extensions
from .media.images import IMAGES, generate_images
from .schemas import ImageRequest
from .served import Served
from .serving import serve
from .validation import parse

if TYPE_CHECKING:
    from ..coordinator import Coordinator


async def run_job(coord: Coordinator, job: Job, on_dispatch: Dispatched) -> Served:
    body = dict(job.body)
    ext = pop_extensions(body, {})
    ext.client_id = ext.client_id or job.client_id
    ext.request_id = job.id  # its place in the queue is found by the job's id
    if job.endpoint == IMAGES:
        request = parse(ImageRequest, {**body, **ext.extra})
        return await generate_images(coord, request, ext, coord.base_url,
                                     on_dispatch=on_dispatch)
    body["stream"] = False
    return await serve(coord, job.endpoint, body, ext, on_dispatch=on_dispatch)
