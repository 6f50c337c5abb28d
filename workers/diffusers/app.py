"""The worker's HTTP surface: routes only. Typed ``WorkerError``s become OpenAI error bodies.

    GET  /health    200 once loaded (also while parked in RAM), 503 while loading or failed
    GET  /progress  the running (or last) generation's denoising steps
    POST /generate  admitted only while the pipeline is READY (409 pipeline_offloaded when
                    parked or moving, 503 not_ready while loading or failed); images only
                    (400 unsupported_endpoint on a video pipeline)
    POST /video     a video pipeline's clip as a base64 MP4, admitted, queued, tracked and
                    cancelled as /generate is (``video``; 400 unsupported_endpoint on an
                    image pipeline)
    POST /cancel    {"request_id"} or no body (every admitted generation)
    POST /offload   weights to CPU RAM (409 busy while a generation is admitted)
    POST /onload    weights back to the device
    POST /shutdown  cancel what runs, then stop the server
    POST /load      a spare (``--spare``) takes its model: {"args": [model flags],
                    "cuda_visible_devices"}; answers once the load is over, as /health would
                    (409 busy on a worker that is no spare)

With an API key (the coordinator's per-worker secret) every route, ``/health`` included,
answers 401 without ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..auth import require_key
from ..pipeline_kinds import PipelineKind
from ..spare import InvalidOptions, LoadRequest
from .errors import InvalidRequest, Unauthorized, WorkerError, envelope
from .generation import Generator
from .loader import LoadedPipeline
from .options import WorkerOptions, load_args
from .pipeline import LOADED, PipelineHolder, PipelineState
from .schemas import CancelRequest, GenerateRequest
from .video import VideoGenerator, VideoRequest, require_kind

log = logging.getLogger(__name__)


def create_app(holder: PipelineHolder, generator: Generator,
               load: Callable[[WorkerOptions], LoadedPipeline],
               shutdown: Callable[[], None] | None = None,
               api_key: str | None = None) -> FastAPI:
    """The app; ``load`` runs in the background from startup (a spare's from ``POST /load``),
    ``shutdown`` is called by ``POST /shutdown``; with ``api_key`` every request must carry it
    as a bearer token."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if holder.state is PipelineState.LOADING:
            options = holder.options
            holder.start_loading(lambda: load(options))
        yield
        generator.cancel()

    app = FastAPI(title="diffusers worker", lifespan=lifespan)
    videos = VideoGenerator(generator)  # the generator's admission, lock and progress

    require_key(app, api_key, lambda: _error(Unauthorized("missing or wrong API key")))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(p for p in first["loc"][1:] if isinstance(p, str)) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        return _error(InvalidRequest(message, param=param))

    @app.exception_handler(WorkerError)
    async def _worker_error(_request: Request, exc: WorkerError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(envelope(500, f"{type(exc).__name__}: {exc}"[:500],
                                     code="server_error"), status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {**holder.report(), "progress": generator.progress()}
        return JSONResponse(body, status_code=200 if holder.state in LOADED else 503)

    @app.get("/progress")
    async def progress() -> dict[str, Any]:
        return generator.progress()

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> dict[str, Any]:
        require_kind(holder.loaded, PipelineKind.IMAGE)
        return await generator.generate(req)

    @app.post("/video")
    async def video(req: VideoRequest) -> dict[str, Any]:
        return await videos.generate(req)

    @app.post("/cancel")
    async def cancel(req: CancelRequest | None = None) -> dict[str, Any]:
        return generator.cancel(req.request_id if req else None)

    @app.post("/offload")
    async def offload() -> dict[str, Any]:
        return await holder.offload()

    @app.post("/onload")
    async def onload() -> dict[str, Any]:
        return await holder.onload()

    @app.post("/load")
    async def load_model(req: LoadRequest) -> JSONResponse:
        try:
            options = load_args(holder.options, req.args)
        except InvalidOptions as exc:
            raise InvalidRequest(f"args: {exc}", param="args") from None
        holder.assign(options)  # 409 busy unless this worker is a spare, and only once
        if req.cuda_visible_devices is not None:  # CUDA reads it at its first use, below
            os.environ["CUDA_VISIBLE_DEVICES"] = req.cuda_visible_devices
        await asyncio.to_thread(holder.start_loading(lambda: load(options)).join)
        return await health()

    @app.post("/shutdown")
    async def shutdown_now() -> dict[str, Any]:
        generator.cancel()
        if shutdown is not None:
            shutdown()
        return {"stopping": True}

    return app


def _error(exc: WorkerError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)
