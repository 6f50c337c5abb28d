"""AUTOMATIC1111's routes (``/sdapi/v1/*``): txt2img, img2img (inpainting where the mask is
white), and the model list and options its clients read first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...services import pop_extensions
from ...services.media.sdapi import IMG2IMG, TXT2IMG, picture_models, sdapi_images
from ...tenancy.keys import identity_of, sees
from ..context import coordinator_of, disconnect_watch, to_response
from ..errors import OpenAIError, documented
from .forms import read_body

router = APIRouter(tags=["automatic1111"], responses=documented(OpenAIError))
BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["prompt"], "additionalProperties": True}}}}}


@router.post(TXT2IMG, openapi_extra=BODY)
async def txt2img(request: Request) -> Response:
    """A1111's ``txt2img``: ``prompt``, ``negative_prompt``, ``steps``, ``cfg_scale``,
    ``width``, ``height``, ``seed`` (-1: random), ``batch_size`` × ``n_iter`` pictures."""
    return await _pictures(request, edit=False)


@router.post(IMG2IMG, openapi_extra=BODY)
async def img2img(request: Request) -> Response:
    """A1111's ``img2img``: the first of ``init_images`` edited by ``denoising_strength``,
    inpainted where ``mask`` is white."""
    return await _pictures(request, edit=True)


@router.get("/sdapi/v1/sd-models")
async def sd_models(request: Request) -> list[dict[str, Any]]:
    """The text-to-image models, as A1111 lists its checkpoints."""
    coord = coordinator_of(request)
    identity = identity_of(request.scope)
    return [{"title": model_id, "model_name": model_id, "hash": None, "sha256": None,
             "filename": model_id, "config": None}
            for model_id in picture_models(coord)
            if sees(identity, coord.catalog.get(model_id).manifest.names)]


@router.get("/sdapi/v1/options")
async def options(request: Request) -> dict[str, Any]:
    """The one option A1111 clients read: the checkpoint a request that names none gets."""
    found = await sd_models(request)
    return {"sd_model_checkpoint": found[0]["title"] if found else None}


async def _pictures(request: Request, edit: bool) -> Response:
    body = await read_body(request, frozenset())
    ext = pop_extensions(body, request.headers,
                         identity_of(request.scope))
    async with disconnect_watch(request) as gone:
        served = await sdapi_images(coordinator_of(request), body, ext, str(request.base_url),
                                    edit=edit, disconnected=gone)
    return to_response(served)
