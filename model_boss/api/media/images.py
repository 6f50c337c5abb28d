"""``POST /v1/images/edits``: OpenAI's image edits (``images.edit`` of its clients; Open
WebUI's image editing), the picture edited with the text-to-image model's own pipeline,
inpainted where the mask is transparent."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...services import EditRequest, edit_images, parse, pop_extensions
from ...services.media.forms import EDIT_FILES, EDIT_LISTS
from ...services.media.images import EDITS
from ...tenancy.keys import identity_of
from ..context import coordinator_of, disconnect_watch, to_response
from ..errors import OpenAIError, documented
from .forms import read_body

router = APIRouter(tags=["openai"], responses=documented(OpenAIError))
EDIT_FORM = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": EditRequest.model_json_schema()},
    "application/json": {"schema": EditRequest.model_json_schema()}}}}


@router.post(EDITS, openapi_extra=EDIT_FORM)
async def images_edits(request: Request) -> Response:
    """The first ``image`` edited (image-to-image), or inpainted where ``mask`` is
    transparent; ``strength`` (0-1: how far from the picture), ``steps``, ``seed``,
    ``guidance``, ``negative_prompt`` and ``reference_images`` as extensions."""
    fields = await read_body(request, EDIT_FILES, EDIT_LISTS)
    edit = parse(EditRequest, fields)
    ext = pop_extensions(edit.model_dump(exclude_unset=True), request.headers,
                         identity_of(request.scope))
    async with disconnect_watch(request) as gone:
        served = await edit_images(coordinator_of(request), edit, ext, str(request.base_url),
                                   disconnected=gone)
    return to_response(served)
