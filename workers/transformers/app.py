"""The worker's HTTP surface.

    GET  /health          200 once loaded (also while parked in RAM), 503 loading or failed
    POST /v1/embeddings   OpenAI's body and answer (embedding task)
    POST /v1/rerank       {query, documents, top_n?, return_documents?} (rerank task; also
                          /rerank): results by relevance, as llama.cpp, Jina and Cohere answer
    POST /offload         weights to CPU RAM;  POST /onload  back to the device
    POST /shutdown        stop the server

Requests on a parked (offloaded) model answer 409 ``model_offloaded``: the coordinator onloads
it first, so one never runs on the CPU copy. With an API key every route answers 401 without
``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from ..auth import require_key
from .batcher import Batcher
from .engine import Engine, NotLoaded

log = logging.getLogger(__name__)

Text = Annotated[StrictStr, Field(min_length=1)]


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: Text | list[Any] = Field(description="a string or an array of strings")
    encoding_format: str = "float"
    dimensions: int | None = Field(default=None, ge=1)
    model: str | None = None


class Document(BaseModel):
    text: Text


class RerankBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: Text
    documents: list[Text | Document] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    model: str | None = None


class WorkerError(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return JSONResponse({"error": {"message": self.message, "type": kind,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status)


def create_app(engine: Engine, *, shutdown: Callable[[], None] | None = None,
               api_key: str | None = None) -> FastAPI:
    options = engine.options
    run = engine.embed if options.task == "embedding" else engine.rerank
    batcher = Batcher(run, options.batch_size, options.max_batch_wait_ms / 1000)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        loading = asyncio.create_task(asyncio.to_thread(engine.load))
        yield
        loading.cancel()
        await batcher.stop()

    app = FastAPI(title="transformers worker", lifespan=lifespan)

    require_key(app, api_key,
                lambda: WorkerError(401, "missing or wrong API key", "invalid_api_key").response())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        return WorkerError(400, message, "invalid_value", param).response()

    @app.exception_handler(WorkerError)
    async def _worker_error(_request: Request, exc: WorkerError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(NotLoaded)
    async def _not_loaded(_request: Request, exc: NotLoaded) -> JSONResponse:
        if str(exc) == "offloaded":
            return WorkerError(409, "the model is parked in CPU RAM", "model_offloaded").response()
        return WorkerError(503, f"the model is {exc}", "not_ready").response()

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {**engine.report(), "batches": batcher.batches, "largest_batch": batcher.largest}
        ok = engine.state in ("ready", "offloaded")
        return JSONResponse(body, status_code=200 if ok else 503)

    def _serves(task: str) -> None:
        if options.task != task:
            raise WorkerError(400, f"this model is of kind '{options.task}'; it does not "
                              f"serve {task}", "unsupported_endpoint", "model")
        if engine.state != "ready":
            raise NotLoaded(engine.state)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsBody) -> dict[str, Any]:
        _serves("embedding")
        texts = _texts(body.input, options.max_items)
        if body.encoding_format not in ("float", "base64"):
            raise WorkerError(400, "encoding_format: must be 'float' or 'base64'",
                              "invalid_value", "encoding_format")
        if body.dimensions is not None and body.dimensions > (engine.dimensions or 0):
            raise WorkerError(400, f"dimensions: at most {engine.dimensions} for this model",
                              "invalid_value", "dimensions")
        embedded = await batcher.submit(texts)
        tokens = sum(n for _, n in embedded)
        data = [{"object": "embedding", "index": i,
                 "embedding": _encode(_shorten(v, body.dimensions), body.encoding_format)}
                for i, (v, _) in enumerate(embedded)]
        return {"object": "list", "data": data, "model": body.model or "",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def rerank(body: RerankBody) -> dict[str, Any]:
        _serves("rerank")
        documents = [d if isinstance(d, str) else d.text for d in body.documents]
        if len(documents) > options.max_items:
            raise WorkerError(400, f"documents: at most {options.max_items}", "invalid_value",
                              "documents")
        scored = await batcher.submit([(body.query, d) for d in documents])
        scores = [score for score, _ in scored]
        order = sorted(range(len(documents)), key=lambda i: -scores[i])[:body.top_n]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": documents[i]}} if body.return_documents else {})}
                   for i in order]
        tokens = sum(n for _, n in scored)
        return {"id": f"rerank-{uuid.uuid4().hex[:16]}", "model": body.model or "",
                "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    app.post("/v1/rerank")(rerank)
    app.post("/rerank")(rerank)

    @app.post("/offload")
    async def offload() -> dict[str, Any]:
        return await asyncio.to_thread(engine.offload)

    @app.post("/onload")
    async def onload() -> dict[str, Any]:
        return await asyncio.to_thread(engine.onload)

    @app.post("/shutdown")
    async def shutdown_now() -> dict[str, Any]:
        if shutdown is not None:
            shutdown()
        return {"stopping": True}

    return app


def _texts(value: Any, limit: int) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise WorkerError(400, "input: must not be empty", "invalid_value", "input")
    if len(texts) > limit:
        raise WorkerError(400, f"input: at most {limit} texts in one request",
                          "invalid_value", "input")
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise WorkerError(400, f"input.{position}: token arrays are not taken by this "
                              "model; send text", "invalid_value", "input")
        if not text:
            raise WorkerError(400, f"input.{position}: must not be an empty string",
                              "invalid_value", "input")
    return texts


def _shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """The first ``dimensions`` values, scaled back to unit length (as OpenAI's do)."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = sum(x * x for x in head) ** 0.5 or 1.0
    return [x / norm for x in head]


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector
