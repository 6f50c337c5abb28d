"""Error answers in the envelope of the API a route belongs to: Ollama's ``{"error": "..."}``
on ``/api/*`` and Anthropic's ``{"type": "error", "error": {...}}`` on ``/v1/messages``.
Everything below the routes raises model-boss errors, rendered in OpenAI's envelope; this
middleware rewrites a finished error answer (a validation failure, a missing key, a body
over the limit, a refusal) for its routes, status and headers (``Retry-After``) kept."""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...cluster import FORWARDED_HEADER

Rewrite = Callable[[int, bytes], bytes]


class ErrorEnvelope:
    """On the paths ``owns`` claims, every error answer's body passed through ``rewrite``
    (status, body → body). ``json_body``: a request body is JSON whatever its content type
    says (Ollama reads it so; ``curl -d`` sends a form type). Other paths pass untouched."""

    def __init__(self, app: ASGIApp, *, owns: Callable[[str], bool], rewrite: Rewrite,
                 json_body: bool = False) -> None:
        self.app = app
        self.owns = owns
        self.rewrite = rewrite
        self.json_body = json_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a cluster member's forward gets OpenAI's envelope, which the member reads back
        if scope["type"] != "http" or not self.owns(scope["path"]) \
                or FORWARDED_HEADER.encode() in dict(scope["headers"]):
            await self.app(scope, receive, send)
            return
        if self.json_body:
            MutableHeaders(scope=scope)["content-type"] = "application/json"
        start: Message | None = None
        parts: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is whole
                return
            if start is None:
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = self.rewrite(start["status"], b"".join(parts))
            headers = MutableHeaders(raw=list(start["headers"]))
            headers["content-length"] = str(len(body))
            headers["content-type"] = "application/json"
            await send({**start, "headers": headers.raw})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewrite)
