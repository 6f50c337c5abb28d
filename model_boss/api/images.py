"""``POST /v1/images/generations`` (OpenAI-compatible) and the files it can link to."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..services import FILES_PATH, IMAGES, ImageRequest, generate_images, pop_extensions
from .context import coordinator_of, disconnect_watch, to_response

router = APIRouter(tags=["openai"])


@router.post(IMAGES)
async def images_generations(request: Request, body: ImageRequest) -> Response:
    ext = pop_extensions(body.model_dump(exclude_unset=True), request.headers)
    async with disconnect_watch(request) as gone:
        served = await generate_images(coordinator_of(request), body, ext,
                                       str(request.base_url), disconnected=gone)
    return to_response(served)


@router.get(FILES_PATH + "{name}", response_class=Response,
            responses={200: {"content": {"image/png": {}}}})
async def image_file(request: Request, name: str) -> Response:
    path = coordinator_of(request).image_files.path(name)
    return Response(path.read_bytes(), media_type="image/png")
