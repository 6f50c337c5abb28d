"""Image generation: an OpenAI images request served through the diffusers worker,
with answers rewritten to file URLs when asked."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import orjson

from ...jobs.runner import Dispatched
from ..cancel import Departure
from ..extensions import Extensions
from ..schemas import ImageRequest
from ..served import MODEL_HEADER, Served
from ..serving import serve

if TYPE_CHECKING:
    from ...coordinator import Coordinator

IMAGES = "/v1/images/generations"
FILES_PATH = "/v1/images/files/"


async def generate_images(coord: Coordinator, request: ImageRequest, ext: Extensions,
                          base_url: str, *, disconnected: Departure | None = None,
                          on_dispatch: Dispatched | None = None) -> Served:
    """Serve ``request``; log the worker's VAE decision; with ``response_format: url`` keep
    the PNGs and answer links under ``base_url`` instead of base64."""
    served = await serve(coord, IMAGES, request.worker_body(), ext, disconnected=disconnected,
                         on_dispatch=on_dispatch)
    if served.status != 200 or served.chunks is not None:
        return served
    data = orjson.loads(served.body)
    extra = data.get("x_model_boss") or {}
    coord.events.emit("vae_decision", model=served.headers.get(MODEL_HEADER),
                      **(extra.get("memory_decisions") or {}))
    if request.response_format != "url":
        return served
    for item in data.get("data", []):
        name = coord.image_files.save(base64.b64decode(item.pop("b64_json")))
        item["url"] = f"{base_url.rstrip('/')}{FILES_PATH}{name}"
    return Served(200, served.headers, "application/json", body=orjson.dumps(data))
