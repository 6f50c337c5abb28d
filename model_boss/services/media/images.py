"""Pictures: generations and edits (image-to-image, inpainting) served through the diffusers
worker, references checked and passed along, answers rewritten to file URLs when asked."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import orjson

from ...endpoints import EDITS, IMAGES
from ...errors import BadRequest
from ...jobs.runner import Dispatched
from ..cancel import Departure
from ..extensions import Extensions
from ..schemas import EditRequest, ImageRequest
from ..served import MODEL_HEADER, Served
from ..serving import serve
from .pictures import (
    fitted_size,
    from_text,
    mask_from_alpha,
    mask_from_white,
    open_picture,
    png_text,
)

if TYPE_CHECKING:
    from ...coordinator import Coordinator

FILES_PATH = "/v1/images/files/"


async def generate_images(coord: Coordinator, request: ImageRequest, ext: Extensions,
                          base_url: str, *, disconnected: Departure | None = None,
                          on_dispatch: Dispatched | None = None) -> Served:
    """Serve ``request``; log the worker's VAE decision; with ``response_format: url`` keep
    the PNGs and answer links under ``base_url`` instead of base64."""
    body = request.worker_body()
    body.update(references(request.reference_images, request.reference_strength,
                            coord.settings.max_image_side))
    served = await serve(coord, IMAGES, body, ext, disconnected=disconnected,
                         on_dispatch=on_dispatch)
    return _answered(coord, served, request.response_format, base_url)


async def edit_images(coord: Coordinator, request: EditRequest, ext: Extensions,
                      base_url: str, *, white_mask: bool = False,
                      disconnected: Departure | None = None,
                      on_dispatch: Dispatched | None = None) -> Served:
    """Serve an edit: every picture checked here (a 400 naming it) before a model is chosen,
    then the text-to-image model's own slot runs it. ``white_mask``: the mask marks what to
    repaint in white (AUTOMATIC1111's), not by transparency (OpenAI's)."""
    body = edit_body(request, coord.settings.max_image_side, white_mask)
    served = await serve(coord, EDITS, body, ext, disconnected=disconnected,
                         on_dispatch=on_dispatch)
    return _answered(coord, served, request.response_format, base_url)


def edit_body(request: EditRequest, max_side: int, white_mask: bool = False) -> dict[str, Any]:
    """The edit in the diffusers worker's terms: the picture (RGB PNG), its mask as the
    worker reads one (white is repainted), the output size (the request's, else the
    picture's own to a multiple of 8), and the extensions that are set."""
    images = request.image if isinstance(request.image, list) else [request.image]
    if len(images) > 1:
        raise BadRequest("image: this server edits one picture at a time; pictures that "
                         "should steer it go in reference_images", param="image",
                         code="invalid_value")
    picture = open_picture(from_text(images[0], "image"), "image", max_side)
    if request.size:
        width, height = (int(side) for side in request.size.split("x"))
    else:
        width, height = fitted_size(picture.size, max_side)
    body: dict[str, Any] = {"prompt": request.prompt, "n": request.n or 1, "width": width,
                            "height": height, "image": png_text(picture)}
    if request.mask is not None:
        mask = open_picture(from_text(request.mask, "mask"), "mask", max_side)
        read = mask_from_white if white_mask else mask_from_alpha
        body["mask"] = png_text(read(mask, picture.size), "L")
    if request.model is not None:
        body["model"] = request.model
    for name in ("strength", "steps", "seed", "guidance", "negative_prompt"):
        if (value := getattr(request, name)) is not None:
            body[name] = value
    body.update(references(request.reference_images, request.reference_strength, max_side))
    return body


def references(pictures: list[str] | None, strength: float | None,
                max_side: int) -> dict[str, Any]:
    """Reference pictures checked and as PNGs, with their strength; nothing when none."""
    if not pictures:
        return {}
    checked = [png_text(open_picture(from_text(p, f"reference_images.{i}"),
                                     f"reference_images.{i}", max_side))
               for i, p in enumerate(pictures)]
    found: dict[str, Any] = {"reference_images": checked}
    if strength is not None:
        found["reference_strength"] = strength
    return found


def _answered(coord: Coordinator, served: Served, response_format: str | None,
              base_url: str) -> Served:
    """The worker's answer, its VAE decision logged; with ``response_format: url`` the PNGs
    kept and linked under ``base_url`` instead of sent as base64."""
    if served.status != 200 or served.chunks is not None:
        return served
    data = orjson.loads(served.body)
    extra = data.get("x_model_boss") or {}
    coord.events.emit("vae_decision", model=served.headers.get(MODEL_HEADER),
                      **(extra.get("memory_decisions") or {}))
    if response_format != "url":
        return served
    for item in data.get("data", []):
        name = coord.image_files.save(base64.b64decode(item.pop("b64_json")))
        item["url"] = f"{base_url.rstrip('/')}{FILES_PATH}{name}"
    return Served(200, served.headers, "application/json", body=orjson.dumps(data))
