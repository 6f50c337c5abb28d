"""Every error leaves in the OpenAI envelope with its status and headers: the one place
where the typed hierarchy (``model_boss.errors``) meets HTTP."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import RETRY_503_S, ModelBossError
from ..services import bad_request

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error"}
_CODES = {404: "not_found", 405: "method_not_allowed"}


def envelope(message: str, status: int, *, code: str | None = None, param: str | None = None,
             headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}
    if status == 503 and not any(k.lower() == "retry-after" for k in headers or {}):
        headers = {**(headers or {}), "Retry-After": str(round(RETRY_503_S))}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


def error_response(exc: ModelBossError) -> Response:
    return Response(orjson.dumps(exc.envelope()), status_code=exc.status_code,
                    media_type="application/json", headers=exc.headers())


def internal_error(exc: Exception) -> Response:
    """A bug's answer: still the envelope, still a complete response (the connection lives)."""
    return envelope(f"internal error: {type(exc).__name__}: {exc}", 500, code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Typed errors, validation errors and routing errors. Anything else is caught by
    :class:`~model_boss.api.middleware.internal_errors.InternalErrors`, which answers without
    re-raising."""

    @app.exception_handler(ModelBossError)
    async def _ours(_request: Request, exc: ModelBossError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return error_response(bad_request(exc.errors(), request.headers.get("content-type")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        return envelope(str(exc.detail), exc.status_code, code=_CODES.get(exc.status_code),
                        headers=getattr(exc, "headers", None))


def error_message(raw: bytes) -> str:
    """The message of an error body in any envelope (or the body itself)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message = error.get("message")
    elif isinstance(error, str):
        message = error
    else:
        message = raw.decode(errors="replace").strip()
    return str(message or "request failed")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """OpenAI's error envelope: every route's but Ollama's and Anthropic's."""

    error: OpenAIErrorDetail


class OllamaError(BaseModel):
    """Ollama's error envelope, on ``/api/*`` routes Ollama defines."""

    error: str


def documented(model: type[BaseModel]) -> dict[int | str, dict]:
    """The error answers of a router's routes in its envelope, for ``/openapi.json`` (in
    place of FastAPI's 422, which model-boss never answers: a malformed body is a 400)."""
    return {"4XX": {"model": model, "description":
                    "400 a malformed body (the field named), 401 a missing or wrong key, "
                    "403 a model the key may not use, 404 an unknown model, 409 a state that "
                    "forbids it, 413 a body over the limit, 429 a queue limit (Retry-After)"},
            "5XX": {"model": model, "description":
                    "502 a worker failed, 503 no capacity within the request's budget "
                    "(Retry-After), 504 the worker did not answer in time"}}
