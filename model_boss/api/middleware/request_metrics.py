"""RequestMetrics: each inference request's count and duration by model, route and status
(``POST /v1/...`` and Ollama's chat, generate and embeddings), read off its answer's start."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...coordinator import Coordinator
from ..ollama import DATA_PATHS

MODEL_HEADER = b"x-model-boss-model"


class RequestMetrics:
    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if not (scope["type"] == "http" and scope["method"] == "POST"
                and (path.startswith("/v1/") or path in DATA_PATHS)):
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        seen: dict[str, object] = {}

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for key, value in message.get("headers", []):
                    if key == MODEL_HEADER:
                        seen["model"] = value.decode()
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            if "status" in seen:
                self.coord.metrics.observe_request(str(seen.get("model", "-")), path,
                                                   int(seen["status"]),
                                                   time.monotonic() - started)
