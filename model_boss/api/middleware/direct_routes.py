"""DirectRoutes: a queued POST with a JSON body its route's model accepts reaches the route's
function straight, by its path, instead of through FastAPI's router and request handler.

FastAPI matches a path by trying its routes in turn, each in a context of its own, then solves
the route's dependencies to validate the body: about a third of the coordinator's CPU for a
request it only passes on (docs/BENCHMARKS.md, queue_scale). The routes taken here are those
whose function takes the request and one pydantic body and returns a response, with no
dependencies: the body is parsed and validated by that same model, and the function's
errors go to the app's exception handlers as before (this layer sits inside FastAPI's
exception middleware). Anything else, and every body that does not parse or validate, goes
on to FastAPI unchanged, so its error answers are FastAPI's, word for word."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .limits import giving_first, replaying

Endpoint = Callable[[Request, Any], Awaitable[Response]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """A request header's value by its lower-case name (ASGI servers send names lower-cased,
    as Starlette's ``Headers`` expects too); None when absent."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def direct_route(route: Any) -> tuple[Endpoint, type[BaseModel]] | None:
    """``route``'s function and body model when it can be taken directly: a POST route with
    no path parameters and no dependencies whose function is ``(Request, Model) ->
    Response``."""
    if not isinstance(route, APIRoute) or "POST" not in route.methods or route.dependencies \
            or "{" in route.path or not inspect.iscoroutinefunction(route.endpoint):
        return None
    try:
        hints = typing.get_type_hints(route.endpoint)
    except (NameError, TypeError):
        return None
    params = list(inspect.signature(route.endpoint).parameters)
    if len(params) != 2 or hints.get(params[0]) is not Request \
            or hints.get("return") is not Response:
        return None
    model = hints.get(params[1])
    if not (inspect.isclass(model) and issubclass(model, BaseModel)):
        return None
    return route.endpoint, model


def _is_json(content_type: bytes | None) -> bool:
    return content_type is not None and \
        content_type.split(b";", 1)[0].strip().lower() == b"application/json"


class DirectRoutes:
    """The routes :func:`direct_route` accepts, found by their path; the rest to ``app``
    (FastAPI's router)."""

    def __init__(self, app: ASGIApp, routes: Iterable[Any]) -> None:
        self.app = app
        self.table: dict[str, tuple[Endpoint, type[BaseModel]]] = {}
        taken: set[str] = set()
        for route in routes:  # in the router's order: the first POST route of a path wins
            path = getattr(route, "path", None)
            if path is None or "POST" not in (getattr(route, "methods", None) or ()):
                continue
            if path not in taken:
                taken.add(path)
                found = direct_route(route)
                if found is not None:
                    self.table[path] = found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.table.get(scope["path"]) \
            if scope["type"] == "http" and scope["method"] == "POST" else None
        if entry is None or not _is_json(header(scope, b"content-type")):
            await self.app(scope, receive, send)
            return
        endpoint, model = entry
        raw, receive = await _whole_body(receive)
        body = _validated(raw, model)
        if body is None:  # FastAPI answers it, as it answers every malformed body
            await self.app(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive), body)
        await response(scope, receive, send)


async def _whole_body(receive: Receive) -> tuple[bytes, Receive]:
    """The body (:class:`~.limits.BodyLimit` has read it and gives it whole) and a receive
    that gives it again, then the connection's own messages."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # gone before its whole body came: no body
            return b"", giving_first(message, receive)  # (FastAPI meets the same end)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            raw = b"".join(chunks)
            return raw, replaying(raw, receive)


def _validated(raw: bytes, model: type[BaseModel]) -> BaseModel | None:
    if not raw:
        return None
    try:
        return model.model_validate(orjson.loads(raw))
    except (orjson.JSONDecodeError, ValidationError):
        return None


def take_direct_routes(app: FastAPI, routes: Iterable[Any]) -> None:
    """Put :class:`DirectRoutes` for ``routes`` (the routes of the routers ``app`` includes
    with no prefix and no dependencies, in the order it includes them) in front of ``app``'s
    router, inside FastAPI's own exception middleware, once the app builds its middleware
    stack. Where the stack has no such place (another FastAPI's layout) every request keeps
    FastAPI's way."""
    routes = list(routes)
    build = app.build_middleware_stack

    def build_with_direct_routes() -> ASGIApp:
        stack = build()
        layer: Any = stack
        while layer is not None:
            inner = getattr(layer, "app", None)
            if inner is app.router:
                layer.app = DirectRoutes(app.router, routes)
                break
            layer = inner
        return stack

    app.build_middleware_stack = build_with_direct_routes  # type: ignore[method-assign]
