"""Traced: the server span of each inference request, installed only when tracing is on.

Its parent is the caller's W3C ``traceparent``/``tracestate``; the edge's own stages
(:func:`edge_stage`: the key's check, its rates and quotas), the queue wait, the load and
the worker call (:mod:`model_boss.services.request_trace`) are its children. A job's submit
is traced too: its run links to it. It is outermost, so
it spans the edge's own checks and the whole answer, a stream's included."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...observability import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ...errors import ModelBossError
    from ...tenancy.keys import Identity

__all__ = ["Traced", "edge_stage", "told"]


class Traced:
    """``inference``: the paths whose every request is traced; ``submits``: those traced
    when a POST (a job's submit, which its run links to)."""

    def __init__(self, app: ASGIApp, inference: Collection[str],
                 submits: Collection[str] = ()) -> None:
        self.app = app
        self.inference = inference
        self.submits = submits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in self.inference and not (
                path in self.submits and scope.get("method") == "POST"):
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1")
                   for key, value in scope.get("headers", [])
                   if key in (b"traceparent", b"tracestate")}
        method = scope.get("method", "POST")
        with tracing.start_server_span(f"{method} {path}", headers, {
                "http.request.method": method, "url.path": path}) as server:

            async def observe(message: Message) -> None:
                if server is not None and message["type"] == "http.response.start":
                    server.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, observe)


@contextlib.contextmanager
def edge_stage(name: str) -> Iterator[Span | None]:
    """One of the edge's stages as a child of the request's span, for the ``with`` block;
    None (no span) on a path :class:`Traced` does not trace. The middleware that call it
    do so only where tracing is on (they ask :func:`tracing.on` once, when built)."""
    request_span = tracing.current_span()
    if request_span is None or not request_span.get_span_context().is_valid:
        yield None
        return
    with tracing.span(name) as stage:
        yield stage


def told(stage: Span | None, *, refused: ModelBossError | None = None,
         who: Identity | None = None) -> None:
    """A stage's outcome on its span: ``allowed``, or ``refused`` with the refusal's code and
    status; the key's name and end user where ``who`` says them (never the key itself)."""
    if stage is None:
        return
    attributes: dict[str, object | None] = {"model_boss.edge.outcome": "allowed"}
    if refused is not None:
        attributes = {"model_boss.edge.outcome": "refused",
                      "model_boss.edge.refused_code": refused.code,
                      "http.response.status_code": refused.status_code,
                      "error.type": refused.code or type(refused).__name__}
    if who is not None:
        attributes.update({"model_boss.key": who.key, "model_boss.key.admin": who.admin,
                           "model_boss.end_user": who.end_user or None})
    tracing.annotate(attributes, stage)
