"""Every error leaves in the OpenAI envelope with its status and headers."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ModelBossError

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error"}


def envelope(message: str, status: int, *, code: str | None = None, param: str | None = None,
             error_type: str | None = None, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": message,
                      "type": error_type or _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


def error_response(exc: ModelBossError) -> Response:
    return Response(orjson.dumps(exc.envelope()), status_code=exc.status_code,
                    media_type="application/json", headers=exc.headers())


def sse_error(exc: Exception) -> bytes:
    """The SSE event that carries a failure once a stream has started."""
    if isinstance(exc, ModelBossError):
        body = exc.envelope()
    else:
        body = {"error": {"message": f"stream failed: {exc}", "type": "server_error",
                          "param": None, "code": "stream_failed"}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ModelBossError)
    async def _ours(_request: Request, exc: ModelBossError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        return envelope(message, 400, code="invalid_request", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return envelope(str(exc.detail), exc.status_code, code=code,
                        headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return envelope(f"internal error: {type(exc).__name__}: {exc}", 500,
                        code="internal_error")
