"""AUTOMATIC1111's web API, as the clients of Stable Diffusion web UIs call it (Open WebUI,
SillyTavern, Krita plugins; llama-swap and LocalAI pass it through): ``txt2img`` and
``img2img`` read into the same generations and edits the OpenAI routes serve, and answered
in A1111's shape (``images`` as base64, ``parameters``, ``info`` as a JSON string).

The model is the request's ``override_settings.sd_model_checkpoint`` or ``model``, else the
text-to-image model that is loaded, else the first one the catalog has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ...catalog import BackendKind, Category
from ...errors import BadRequest, ModelNotFound
from ...slot_key import model_of
from ..cancel import Departure
from ..extensions import Extensions
from ..schemas import EditRequest, ImageRequest
from ..served import Served
from ..validation import parse
from .images import edit_images, generate_images

if TYPE_CHECKING:
    from ...coordinator import Coordinator

TXT2IMG = "/sdapi/v1/txt2img"
IMG2IMG = "/sdapi/v1/img2img"
# A1111's names → ours; what is not here (sampler_name, restore_faces, ...) is not used
_COMMON = {"prompt": "prompt", "negative_prompt": "negative_prompt", "steps": "steps",
           "cfg_scale": "guidance", "seed": "seed"}


def picture_models(coord: Coordinator) -> list[str]:
    """The text-to-image models a key may use, loaded ones first."""
    ready = {model_of(key) for key in coord.pool.slots}  # a copy's model
    found = [e.manifest.id for e in coord.catalog if e.available
             and e.manifest.backend == BackendKind.DIFFUSERS
             and e.manifest.category == Category.DIFFUSION]
    return sorted(found, key=lambda model_id: model_id not in ready)


def _model(coord: Coordinator, body: dict[str, Any]) -> str:
    overrides = body.get("override_settings")
    named = overrides.get("sd_model_checkpoint") if isinstance(overrides, dict) else None
    named = named or body.get("model")
    if isinstance(named, str) and named:
        return named.split(" [")[0]  # A1111 titles read "name [hash]"
    found = picture_models(coord)
    if not found:
        raise ModelNotFound("no text-to-image model is served here", param="model")
    return found[0]


def _ours(coord: Coordinator, body: dict[str, Any]) -> dict[str, Any]:
    """The fields both routes share, in our names."""
    if not isinstance(body.get("prompt"), str) or not body["prompt"].strip():
        raise BadRequest("prompt: required", param="prompt", code="missing_field")
    fields: dict[str, Any] = {"model": _model(coord, body)}
    for theirs, ours in _COMMON.items():
        value = body.get(theirs)
        if value is not None and not (theirs == "seed" and value == -1):  # -1: random
            fields[ours] = value
    width, height = body.get("width"), body.get("height")
    if width is not None or height is not None:
        fields["size"] = f"{width or 512}x{height or 512}"
    count = (body.get("batch_size") or 1) * (body.get("n_iter") or 1)
    if not isinstance(count, int) or count < 1:
        raise BadRequest("batch_size, n_iter: must be whole numbers of at least 1",
                         param="batch_size", code="invalid_value")
    fields["n"] = count
    return fields


async def sdapi_images(coord: Coordinator, body: dict[str, Any], ext: Extensions,
                       base_url: str, *, edit: bool,
                       disconnected: Departure | None = None) -> Served:
    """Serve an A1111 ``txt2img`` (or, with ``edit``, ``img2img``) body; its answer."""
    fields = _ours(coord, body)
    if edit:
        pictures = body.get("init_images")
        if not isinstance(pictures, list) or not pictures:
            raise BadRequest("init_images: send the picture to start from (base64)",
                             param="init_images", code="missing_field")
        fields.update(image=pictures[0], strength=body.get("denoising_strength", 0.75))
        mask = body.get("mask")
        if mask:
            fields["mask"] = mask
        request = parse(EditRequest, fields)
        served = await edit_images(coord, request, ext, base_url, white_mask=True,
                                   disconnected=disconnected)
    else:
        request = parse(ImageRequest, {**{k: v for k, v in fields.items()
                                          if k not in ("steps", "seed", "guidance",
                                                       "negative_prompt")},
                                       **{f"x_{k}": fields[k] for k in
                                          ("steps", "seed", "guidance", "negative_prompt")
                                          if k in fields}})
        served = await generate_images(coord, request, ext, base_url,
                                       disconnected=disconnected)
    if served.status != 200 or served.chunks is not None:
        return served
    return Served(200, served.headers, "application/json",
                  body=orjson.dumps(_a1111(orjson.loads(served.body), body, fields)))


def _a1111(answer: dict[str, Any], asked: dict[str, Any], fields: dict[str, Any]) -> dict:
    """Our images answer in A1111's shape."""
    images = [item.get("b64_json") for item in answer.get("data", [])]
    figures = answer.get("x_model_boss") or {}
    seed = figures.get("seed")
    parameters = {k: v for k, v in asked.items() if k not in ("init_images", "mask")}
    size = (fields.get("size") or "512x512").split("x")
    info = {"prompt": fields.get("prompt"), "seed": seed, "width": int(size[0]),
            "height": int(size[1]),
            "sd_model_name": fields.get("model"), "steps": fields.get("steps"),
            "cfg_scale": fields.get("guidance")}
    return {"images": images, "parameters": parameters, "info": orjson.dumps(info).decode()}
