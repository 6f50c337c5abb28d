"""The FastAPI application: routers, error envelopes, middleware, the coordinator's lifespan."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from ..coordinator import Coordinator
from ..endpoints import JOBS
from ..observability import tracing
from ..services import EDITS, run_job
from ..services.media.audio import UPLOAD_PATHS
from ..services.media.sdapi import IMG2IMG
from ..services.media.videos import VIDEOS
from ..services.realtime import OpenSessions
from ..services.request_trace import follow_loads
from ..settings import Settings, load_settings
from . import (
    admin,
    anthropic,
    dashboard,
    history,
    jobs,
    leases,
    llamacpp,
    ollama,
    openai,
    pulls,
    realtime,
    voices,
)
from .errors import install_error_handlers
from .media import images as media_images
from .media import sdapi, videos
from .middleware import (
    Admission,
    BodyLimit,
    EarlyForwarding,
    ErrorEnvelope,
    ForwardTrust,
    HostGuard,
    Identify,
    InternalErrors,
    Pacing,
    QueueGate,
    RequestMetrics,
    take_direct_routes,
    with_cors,
)
from .middleware.drain import DrainGate
from .middleware.tracing import Traced
from .openapi_doc import DOCS_ASSETS, document_bounds, offline_redoc
from .tenants import keys as tenant_keys
from .tenants import usage as tenant_usage


def create_app(settings: Settings | None = None, *,
               coordinator: Coordinator | None = None) -> FastAPI:
    """Build the app. Without settings or a coordinator, settings come from the environment
    and the YAML file ``MODEL_BOSS_CONFIG`` names (as ``model-boss serve --config`` reads),
    so ``uvicorn --factory model_boss.api.app:create_app`` serves the same daemon. The
    coordinator starts with the app's lifespan and stops with it."""
    coord = coordinator or Coordinator(settings or load_settings(), job_work=run_job)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await coord.start()
        try:
            yield
        finally:
            await sessions.end_all()  # a stop without a drain (one ran it already)
            await coord.stop()
            if traces is not None:
                traces.force_flush()

    # /docs and /redoc from the package's own copies of Swagger UI and ReDoc (fastapi-offline),
    # not a CDN: they work on a box with no internet
    app = FastAPIOffline(title="model-boss", version="0.1.0", lifespan=lifespan,
                         static_url=DOCS_ASSETS, redoc_url=None, **NO_FRAMEWORK_TELEMETRY)
    offline_redoc(app)
    app.state.coordinator = coord
    # open /v1/realtime sessions: a stop's drain ends them first (their models are let go)
    sessions = app.state.realtime_sessions = OpenSessions(coord)
    coord.drain.on_begin.append(sessions.end_all)
    app.state.boss = coord.boss
    install_error_handlers(app)
    document_bounds(app)
    # the last added runs first: pacing (arrivals take turns with running work) → CORS →
    # Ollama's and Anthropic's envelopes → the drain (a stop's refusals and cuts) → errors →
    # Host and Origin checks (before any work; their refusals in the route's envelope) →
    # cluster members' forwards trusted or refused → who the request is (its key) → the
    # key's rates and quotas → request metrics → the queue's early refusals → body limits →
    # early forwards (cluster members) → routes
    app.add_middleware(EarlyForwarding, coordinator=coord)
    app.add_middleware(BodyLimit, max_bytes=coord.settings.max_body_bytes,
                       uploads=(UPLOAD_PATHS | MEDIA_UPLOADS, coord.settings.max_upload_bytes))
    app.add_middleware(QueueGate, coordinator=coord, paths=queued_paths())
    app.add_middleware(RequestMetrics, coordinator=coord)
    app.add_middleware(Admission, coordinator=coord, inference=queued_paths())
    app.add_middleware(Identify, coordinator=coord)
    app.add_middleware(ForwardTrust, coordinator=coord)
    app.add_middleware(HostGuard, coordinator=coord)
    app.add_middleware(InternalErrors)
    app.add_middleware(DrainGate, coordinator=coord)
    app.add_middleware(ErrorEnvelope, owns=anthropic.is_anthropic_path,
                       rewrite=anthropic.anthropic_error_body)
    app.add_middleware(ErrorEnvelope, owns=ollama.is_ollama_path,
                       rewrite=ollama.ollama_error_body, json_body=True)
    app.add_middleware(with_cors, origins=coord.settings.cors_origins)
    app.add_middleware(Pacing, busy=lambda: coord.queue.depth > 0)
    # None, and nothing imported, unless OTEL_* or the tracing: section turn it on
    traces = tracing.configure(settings=coord.settings.tracing)
    if traces is not None:  # outermost: the request's span covers the edge's checks too
        app.add_middleware(Traced, inference=queued_paths(), submits=(JOBS, VIDEOS))
        follow_loads(coord)  # the stages of the loads requests wait for
    routers = [module.router for module in (openai, realtime, media_images, sdapi, videos,
                                            anthropic, llamacpp, ollama, admin, history, pulls,
                                            jobs, leases, tenant_keys, tenant_usage, voices,
                                            dashboard)]
    for router in routers:
        app.include_router(router)
    take_direct_routes(app, [route for router in routers for route in router.routes])
    return app


# FastAPI (0.16x) makes request spans of its own once a tracer provider is set: they would
# stand beside the edge's (Traced) and take the stages under its operation spans
NO_FRAMEWORK_TELEMETRY: dict[str, Any] = {"telemetry": {
    "tracing": False, "metrics": False, "logs": False, "operation_spans": False}} \
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {}
# pictures, clips and voices sent in: bounded as uploads are (max_upload_bytes), not as JSON
MEDIA_UPLOADS = frozenset({EDITS, VIDEOS, IMG2IMG, voices.VOICES_PATH})


def queued_paths() -> frozenset[str]:
    """The routes whose requests wait in the queue: every POST of the OpenAI, Anthropic and
    llama.cpp routers, and Ollama's inference routes."""
    routes = [*openai.router.routes, *media_images.router.routes, *sdapi.router.routes,
              *anthropic.router.routes, *llamacpp.router.routes]
    return frozenset({route.path for route in routes if "POST" in getattr(route, "methods", ())}
                     | ollama.QUEUED_PATHS)
