"""``POST /v1/images/generations`` (OpenAI-compatible) and the files it can link to."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..coordinator import Coordinator
from ..errors import BadRequest
from ..inference import SlotTicket
from .proxy import coordinator_of, serve
from .requests import (
    ClientDisconnected,
    Extensions,
    _number,
    cancelled_on_disconnect,
    pop_extensions,
    read_json_body,
)

router = APIRouter()

_SIZE = re.compile(r"^(\d{2,4})x(\d{2,4})$")
MAX_SIDE = 4096


def image_body(body: dict[str, Any], ext: Extensions) -> dict[str, Any]:
    """Validate an OpenAI images request (plus ``x_*`` extensions) into the worker's terms."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("'prompt' must be a non-empty string", param="prompt")
    if len(prompt) > 32000:
        raise BadRequest("'prompt' is longer than 32000 characters", param="prompt")
    n = body.get("n", 1)
    if n is None:
        n = 1
    n = int(_number(n, "n", integer=True, low=1, high=10))
    size = body.get("size") or "512x512"
    match = _SIZE.match(size) if isinstance(size, str) else None
    if not match:
        raise BadRequest("'size' must look like '512x512'", param="size")
    width, height = int(match.group(1)), int(match.group(2))
    if not (64 <= width <= MAX_SIDE and 64 <= height <= MAX_SIDE) or width % 8 or height % 8:
        raise BadRequest(f"'size' sides must be multiples of 8 between 64 and {MAX_SIDE}",
                         param="size")
    response_format = body.get("response_format") or "b64_json"
    if response_format not in ("b64_json", "url"):
        raise BadRequest("'response_format' must be 'b64_json' or 'url'",
                         param="response_format")
    extra = ext.extra or {}
    out: dict[str, Any] = {"prompt": prompt, "n": n, "width": width, "height": height,
                           "response_format": response_format}
    if "model" in body:
        out["model"] = body["model"]
    if extra.get("x_steps") is not None:
        out["steps"] = int(_number(extra["x_steps"], "x_steps", integer=True, low=1, high=200))
    if extra.get("x_seed") is not None:
        out["seed"] = int(_number(extra["x_seed"], "x_seed", integer=True, low=0,
                                  high=2**63 - 1))
    if extra.get("x_guidance") is not None:
        out["guidance"] = float(_number(extra["x_guidance"], "x_guidance", low=0, high=50))
    if extra.get("x_negative_prompt") is not None:
        negative = extra["x_negative_prompt"]
        if not isinstance(negative, str):
            raise BadRequest("'x_negative_prompt' must be a string", param="x_negative_prompt")
        out["negative_prompt"] = negative
    return out


async def generate(coord: Coordinator, body: dict[str, Any], ext: Extensions, base_url: str,
                   *, request: Request | None = None,
                   on_dispatch: Callable[[SlotTicket], None] | None = None) -> Response:
    """Serve a validated images request; rewrite results to URLs when asked."""
    response_format = body.pop("response_format", "b64_json")
    response = await serve(coord, "/v1/images/generations", body, ext, request=request,
                           on_dispatch=on_dispatch)
    if response.status_code != 200:
        return response
    data = orjson.loads(response.body)
    extra = data.get("x_model_boss") or {}
    coord.events.emit("vae_decision", model=response.headers.get("x-model-boss-model"),
                      **(extra.get("memory_decisions") or {}))
    if response_format != "url":
        return response
    files = coord.image_files
    for item in data.get("data", []):
        name = files.save(base64.b64decode(item.pop("b64_json")))
        item["url"] = f"{base_url.rstrip('/')}/v1/images/files/{name}"
    headers = {k: v for k, v in response.headers.items()
               if k.startswith("x-model-boss")}
    return Response(orjson.dumps(data), media_type="application/json", headers=headers)


@router.post("/v1/images/generations")
async def images_generations(request: Request) -> Response:
    coord = coordinator_of(request)
    body = await read_json_body(request, coord.settings.max_body_bytes)
    ext = pop_extensions(body, request.headers)
    worker_body = image_body(body, ext)
    try:
        async with cancelled_on_disconnect(request):
            return await generate(coord, worker_body, ext, str(request.base_url))
    except ClientDisconnected:
        return Response(status_code=499)


@router.get("/v1/images/files/{name}")
async def image_file(request: Request, name: str) -> Response:
    path = coordinator_of(request).image_files.path(name)
    return Response(path.read_bytes(), media_type="image/png")
