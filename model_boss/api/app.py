"""The FastAPI application: routers, error envelopes, auth, the coordinator's lifespan."""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response

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

    @app.middleware("http")
    async def _auth_and_metrics(request: Request, call_next) -> Response:
        denied = _check_key(request, coord.settings)
        if denied is not None:
            return denied
        started = time.monotonic()
        response = await call_next(request)
        path = request.url.path
        if path.startswith("/v1/") and request.method == "POST":
            coord.metrics.observe_request(response.headers.get("x-model-boss-model", "-"),
                                          path, response.status_code,
                                          time.monotonic() - started)
        return response

    app.include_router(openai.router)
    app.include_router(admin.router)
    app.include_router(images.router)
    app.include_router(jobs.router)
    app.include_router(leases.router)
    return app


def _check_key(request: Request, settings: Settings) -> Response | None:
    path = request.url.path
    if path in _OPEN_PATHS:
        return None
    wanted = settings.admin_api_key if path.startswith("/api/") and settings.admin_api_key \
        else settings.api_key
    if not wanted:
        return None
    header = request.headers.get("authorization", "")
    given = header[7:] if header.lower().startswith("bearer ") else \
        request.headers.get("x-api-key", "")
    if hmac.compare_digest(given.encode(), wanted.encode()):
        return None
    return envelope("missing or invalid API key", 401, code="invalid_api_key")
