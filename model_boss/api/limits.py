"""BodyLimit: every request body is read once, here, before any route parses it."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import PayloadTooLarge
from .errors import error_response

_BODY_METHODS = {"POST", "PUT", "PATCH"}


class BodyLimit:
    """Over ``max_bytes`` (declared or counted) is a 413; then the body is replayed to the
    app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(declared)(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody is left to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._too_large(str(size))(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)

    def _too_large(self, size: str):
        return error_response(PayloadTooLarge(
            f"request body of {size} bytes is over the {self.max_bytes} limit"))
