"""BodyLimit: every request body is read once, here, before any route parses it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import BadRequest, PayloadTooLarge
from ..errors import error_response

MAX_JSON_DEPTH = 100  # far beyond any OpenAI body; well inside every (de)serialiser's limit
_BODY_METHODS = {"POST", "PUT", "PATCH"}
_FORM = "application/x-www-form-urlencoded"
_LONG_NUMBER = re.compile(rb"\d{19,}")  # where an integer beyond 64 bits can hide
_INT_RANGE = range(-(2**63), 2**64)  # what orjson can write back out (int64 and uint64)


class BodyLimit:
    """Over ``max_bytes`` (declared or counted) is a 413; a JSON body that could not be
    passed on (nested deeper than :data:`MAX_JSON_DEPTH`, an integer beyond 64 bits) is a
    400. Then the body is replayed to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int, *,
                 uploads: tuple[frozenset[str], int] = (frozenset(), 0)) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_paths, self.max_upload_bytes = uploads  # file uploads: their own limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.max_upload_bytes if scope["path"] in self.upload_paths else self.max_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await self._too_large(declared, limit)(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody is left to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await self._too_large(str(size), limit)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        content_type = headers.get("content-type", "")
        if content_type.startswith(_FORM) and raw.lstrip()[:1] in (b"{", b"[") \
                and scope["path"] not in self.upload_paths:
            # curl -d '{...}' without -H: curl's form type on a JSON body; read it as JSON,
            # as llama.cpp's own server does
            content_type = "application/json"
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                          if k.lower() != b"content-type"]
                     + [(b"content-type", b"application/json")]}
        problem = json_problem(raw) if raw and (not content_type or "json" in content_type) \
            else None
        if problem is not None:
            await error_response(BadRequest(f"request body {problem}"))(scope, receive, send)
            return
        await self.app(scope, replaying(raw, receive), send)

    def _too_large(self, size: str, limit: int):
        return error_response(PayloadTooLarge(
            f"request body of {size} bytes is over the {limit} limit"))


def replaying(raw: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, whole, then the connection's own
    messages (its disconnect)."""
    return giving_first({"type": "http.request", "body": raw, "more_body": False}, receive)


def giving_first(first: Message, receive: Receive) -> Receive:
    """A ``receive`` that gives ``first`` (a message already received), then the
    connection's own messages."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return first

    return replay


def json_problem(raw: bytes) -> str | None:
    """Why a JSON body could not be served as it is, or None. Invalid JSON is left to the
    route, which answers 400 for it with the parser's message."""
    too_deep = f"nests deeper than {MAX_JSON_DEPTH} levels"
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return too_deep if "depth limit" in str(exc) else None  # orjson stops at 1024
        if nesting(value, MAX_JSON_DEPTH + 1) > MAX_JSON_DEPTH:
            return too_deep
    if _LONG_NUMBER.search(raw):
        try:
            value = json.loads(raw)  # as the route reads it: integers of any size
        except ValueError:
            return None
        if any(isinstance(v, int) and v not in _INT_RANGE for v in scalars(value)):
            return "has an integer beyond 64 bits"
    return None


def nesting(value: Any, stop_at: int) -> int:
    """How deep arrays and objects nest in ``value`` (0 for a scalar), counted no further
    than ``stop_at``; breadth first, so no recursion of our own."""
    depth, level = 0, [value]
    while depth < stop_at:
        level = [node for node in level if isinstance(node, (dict, list))]
        if not level:
            break
        depth += 1
        level = [child for node in level
                 for child in (node.values() if isinstance(node, dict) else node)]
    return depth


def scalars(value: Any) -> Iterator[Any]:
    """Every value in ``value`` that is not an array or an object."""
    level = [value]
    while level:
        containers = []
        for node in level:
            if isinstance(node, (dict, list)):
                containers.append(node)
            else:
                yield node
        level = [child for node in containers
                 for child in (node.values() if isinstance(node, dict) else node)]
