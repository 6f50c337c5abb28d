"""llama.cpp's own routes, for clients written for ``llama-server``: their bodies, and what of
their answers a client may see. They are served like every other request (queue, leases,
keys); the body's ``model`` picks the worker (else the default task)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Any

import httpx
import orjson
from pydantic import Field, PlainValidator, StrictBool

from ..backends.base import UpstreamResponse, upstream_error
from ..errors import BadRequest, WorkerCrashed
from .extensions import Int
from .schemas import ChatMessage, OpenAIRequest


def _prompt(value: Any) -> Any:
    # llama.cpp takes a string, token ids, or a list mixing both (or of such lists)
    if isinstance(value, str) or (isinstance(value, list) and value):
        return value
    raise ValueError("must be a string or a non-empty array of strings or token ids")


Prompt = Annotated[Any, PlainValidator(_prompt, json_schema_input_type=str | list[Any])]


class NativeCompletionRequest(OpenAIRequest):
    """``POST /completion``: llama.cpp's text completion (``n_predict`` tokens)."""

    prompt: Prompt
    n_predict: Int | None = Field(default=None, ge=-1)


class InfillRequest(OpenAIRequest):
    """``POST /infill``: fill in the middle, for models with FIM tokens."""

    input_prefix: str = ""
    input_suffix: str = ""
    n_predict: Int | None = Field(default=None, ge=-1)


class TokenizeRequest(OpenAIRequest):
    """``POST /tokenize``."""

    content: str
    add_special: StrictBool | None = None
    with_pieces: StrictBool | None = None


class DetokenizeRequest(OpenAIRequest):
    """``POST /detokenize``."""

    tokens: list[Int]


class ApplyTemplateRequest(OpenAIRequest):
    """``POST /apply-template``: the prompt the model's chat template makes of ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)


NATIVE_BODIES: dict[str, type[OpenAIRequest]] = {
    "/completion": NativeCompletionRequest,
    "/completions": NativeCompletionRequest,  # llama-server's alias, native shape too
    "/infill": InfillRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/apply-template": ApplyTemplateRequest,
}
PROPS = "/props"
_PATH_FIELDS = ("model_path",)


async def worker_props(backend: Any, model_id: str) -> UpstreamResponse:
    """``GET /props`` of a llama.cpp worker, its paths taken out. The data path only POSTs, so
    this reads through the backend's control client (which carries the worker's key)."""
    reply = await worker_get(backend, model_id, PROPS)
    return UpstreamResponse(reply.status_code, {"content-type": "application/json"},
                            body=public_props(reply.content, model_id))


async def worker_get(backend: Any, model_id: str, path: str) -> httpx.Response:
    """A GET of llama.cpp's server's own, through the backend's control client."""
    client: httpx.AsyncClient | None = getattr(backend, "_client", None)
    if not isinstance(client, httpx.AsyncClient):
        raise BadRequest(f"'{model_id}' is not served by llama.cpp's server: no {path}",
                         param="model", code="unsupported_endpoint")
    try:
        reply = await client.get(path)
    except httpx.HTTPError as exc:
        raise WorkerCrashed(f"worker for '{model_id}' did not answer {path} "
                            f"({type(exc).__name__})") from exc
    if reply.status_code >= 400:
        raise upstream_error(model_id, reply.status_code, reply.content)
    return reply


def public_props(raw: bytes, model_id: str) -> bytes:
    """``/props`` without the worker's file paths: the model file by name only, the alias as
    the model's id."""
    try:
        props = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if not isinstance(props, dict):
        return raw
    for name in _PATH_FIELDS:
        if isinstance(props.get(name), str):
            props[name] = PurePath(props[name]).name
    if "model_alias" in props:
        props["model_alias"] = model_id
    return orjson.dumps(props)
