"""Validation failures as model-boss errors: the first problem, its field as ``param``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..backends.registry import BACKENDS
from ..catalog import ModelManifest
from ..endpoints import CHAT, COMPLETIONS
from ..errors import BadRequest

M = TypeVar("M", bound=BaseModel)
_LOCATIONS = {"body", "query", "path", "header", "cookie"}
_NOT_AN_OBJECT = {"model_attributes_type", "model_type", "dict_type"}


def parse(model: type[M], data: Any) -> M:
    """Validate ``data`` as ``model``; a failure is a :class:`BadRequest` naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc.errors()) from exc


def bad_request(errors: Sequence[Any], content_type: str | None = None) -> BadRequest:
    """pydantic's (or FastAPI's) error list → one BadRequest about the first problem.
    ``content_type``: the request's; a body that is not an object because it was not sent
    as JSON (FastAPI leaves such a body unread) is told so."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ())]
    if loc and loc[0] in _LOCATIONS:
        loc = loc[1:]
    message = str(first.get("msg", "invalid request"))
    if first.get("type") == "json_invalid":
        loc = []  # the position of a JSON syntax error is not a field
        message = f"request body is not valid JSON: {(first.get('ctx') or {}).get('error')}"
    param = ".".join(loc) or None
    if param is None and first.get("type") == "missing":
        message = "request body is empty; expected a JSON object"
    elif param is None and first.get("type") in _NOT_AN_OBJECT:
        if content_type and not is_json_type(content_type):
            return BadRequest(f"Content-Type: {content_type}: send the body as "
                              "application/json", code="invalid_content_type")
        message = "request body must be a JSON object"
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    code = "missing_field" if first.get("type") == "missing" else "invalid_request"
    return BadRequest(f"{param}: {message}" if param else message, param=param, code=code)


def is_json_type(content_type: str) -> bool:
    """A content type whose body FastAPI reads as JSON: ``application/json`` or
    ``application/*+json``, parameters aside."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                           and kind.endswith("+json"))


# what a request asks of a model that the model cannot give, known before any load
CHOICE_ENDPOINTS = (CHAT, COMPLETIONS)
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})  # OpenAI, Responses, Anthropic


def blind(manifest: ModelManifest, endpoint: str, body: dict[str, Any]) -> BadRequest | None:
    """Image content for a model with no vision projector: a clear 400 (llama.cpp's server
    would fail it only after the load)."""
    if manifest.sees_images or endpoint not in (CHAT, "/v1/messages", "/v1/responses"):
        return None
    messages = body.get("messages") or body.get("input")
    for position, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(part, dict) and part.get("type")
                                             in IMAGE_PARTS for part in content):
            return BadRequest(f"'{manifest.id}' cannot read images: it has no vision "
                              "projector (a manifest's mmproj, or an mmproj*.gguf beside a "
                              "discovered file)", param=f"messages.{position}.content",
                              code="images_not_supported")
    return None


def too_many_choices(manifest: ModelManifest, endpoint: str,
                      body: dict[str, Any]) -> BadRequest | None:
    # a worker kind that says how many choices it serves (llama: 1); others decide (cloud)
    limit = getattr(BACKENDS.get(manifest.backend), "choices_per_request", None)
    n = body.get("n")
    if endpoint not in CHOICE_ENDPOINTS or limit is None or not isinstance(n, int) or n <= limit:
        return None
    return BadRequest(f"'{manifest.id}' serves at most {limit} choice{'s' * (limit != 1)} "
                      f"per request; 'n' was {n}", param="n", code="n_not_supported")
