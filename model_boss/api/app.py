"""The FastAPI application: routers, error envelopes, auth, the coordinator's lifespan."""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.datastructures import Headers

from ..coordinator import Coordinator
from ..settings import Settings
from . import admin, images, jobs, leases, openai
from .errors import envelope, install_error_handlers

_OPEN_PATHS = {"/health", "/metrics"}


def create_app(settings: Settings | None = None, *,
               coordinator: Coordinator | None = None) -> FastAPI:
    """Build the app. The coordinator starts with the app's lifespan and stops with it."""
    coord = coordinator or Coordinator(settings or Settings())

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await coord.start()
        try:
            yield
        finally:
            await coord.stop()

    app = FastAPI(title="model-boss", version="0.1.0", lifespan=lifespan)
    app.state.coordinator = coord
    app.state.boss = coord.boss
    install_error_handlers(app)

    app.add_middleware(AuthAndMetrics, coordinator=coord)
    app.include_router(openai.router)
    app.include_router(admin.router)
    app.include_router(images.router)
    app.include_router(jobs.router)
    app.include_router(leases.router)
    return app


class AuthAndMetrics:
    """Pure ASGI middleware (no per-request task group): API keys, request metrics."""

    def __init__(self, app, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.coord.settings
        if settings.api_key or settings.admin_api_key:
            denied = _check_key(scope["path"], Headers(scope=scope), settings)
            if denied is not None:
                await denied(scope, receive, send)
                return
        path = scope["path"]
        if not (path.startswith("/v1/") and scope["method"] == "POST"):
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        seen: dict[str, object] = {}

        async def observe(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for key, value in message.get("headers", []):
                    if key == b"x-model-boss-model":
                        seen["model"] = value.decode()
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            if "status" in seen:
                self.coord.metrics.observe_request(str(seen.get("model", "-")), path,
                                                   int(seen["status"]),
                                                   time.monotonic() - started)


def _check_key(path: str, headers: Headers, settings: Settings) -> Response | None:
    if path in _OPEN_PATHS:
        return None
    wanted = settings.admin_api_key if path.startswith("/api/") and settings.admin_api_key \
        else settings.api_key
    if not wanted:
        return None
    header = headers.get("authorization", "")
    given = header[7:] if header.lower().startswith("bearer ") else \
        headers.get("x-api-key", "")
    if hmac.compare_digest(given.encode(), wanted.encode()):
        return None
    return envelope("missing or invalid API key", 401, code="invalid_api_key")
