"""Traced: the server span of each inference request, installed only when tracing is on.

Its parent is the caller's W3C ``traceparent``/``tracestate``; the queue wait, the load and
the worker call (:mod:`model_boss.services.request_trace`) are its children. A job's submit
is traced too: its run links to it. It is outermost, so
it spans the edge's own checks and the whole answer, a stream's included."""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...observability import tracing


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
