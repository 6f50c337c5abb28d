"""``POST /batch``: several requests for one route in one exchange.

The coordinator gathers the embedding and rerank requests that reach it together and sends
them as one: ``{"path": "/v1/embeddings", "parts": [body, ...]}``. Each part runs as if it had
come alone (its own checks, its own ``request_id`` to cancel it by, its own error answer), all
of them at once, so the batcher takes them as one batch, without waiting for more: the
coordinator has done the waiting. The answer frames the parts' answers: one line of JSON,
``[[status, length], ...]``, then the bodies back to back in that order.

One HTTP exchange instead of one per request spares both processes most of a small request's
cost (parsing, routing, the socket's reads and writes), which on a CPU that also runs the model
is most of what serving it costs beside the model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .batcher import GATHERED
from .errors import WorkerError

log = logging.getLogger(__name__)

Route = tuple[type[BaseModel], Callable[[Any], Awaitable[Any]]]


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    parts: list[dict[str, Any]] = Field(min_length=1)


def add_batch_route(app: FastAPI, routes: dict[str, Route]) -> None:
    """``POST /batch`` over ``routes`` (path → the body's model and the route's function);
    a part's failure is answered as the app's exception handlers answer it alone."""

    async def answer(request: Request, route: Route, part: dict[str, Any]) -> tuple[int, bytes]:
        model, handle = route
        try:
            result = await handle(model.model_validate(part))
        except ValidationError as exc:
            return await _handled(app, request, RequestValidationError(  # as FastAPI's own
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]))
        except Exception as exc:  # answered as the app answers it alone
            return await _handled(app, request, exc)
        if isinstance(result, Response):
            return result.status_code, bytes(result.body)
        return 200, orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)

    @app.post("/batch")
    async def batch(request: Request, body: BatchBody) -> Response:
        route = routes.get(body.path)
        if route is None:
            raise WorkerError(400, f"path: not one of {', '.join(routes)}", "invalid_value",
                              "path")
        GATHERED.set(True)  # the tasks below copy it: their asks run without waiting
        answers = await asyncio.gather(*(answer(request, route, part) for part in body.parts))
        frame = orjson.dumps([[status, len(content)] for status, content in answers])
        return Response(b"".join([frame, b"\n", *(content for _, content in answers)]),
                        media_type="application/x-model-boss-parts")


async def _handled(app: FastAPI, request: Request, exc: Exception) -> tuple[int, bytes]:
    handler = next((app.exception_handlers[kind] for kind in type(exc).__mro__
                    if kind in app.exception_handlers and kind is not Exception), None)
    if handler is None:  # a fault of the worker's own: that part's 500, the others answered
        log.error("a part of a batch failed", exc_info=exc)
        response = WorkerError(500, "the worker failed this request", "worker_error").response()
    else:
        response = await handler(request, exc)
    return response.status_code, bytes(response.body)

