"""Models in and out of the models folder: ``POST /api/v1/models/pull`` (progress as NDJSON
lines), ``GET /api/v1/pulls``, ``DELETE /api/v1/pulls/{id}`` (cancel) and
``DELETE /api/v1/models/{model}`` (a discovered or pulled model's files). Admin routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..catalog.pulls.download import parse_source
from ..errors import ModelBossError
from .context import coordinator_of
from .errors import OpenAIError, documented

router = APIRouter(tags=["models"], responses=documented(OpenAIError))


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="hf://ORG/REPO/FILE.gguf, hf://ORG/REPO:QUANT or "
                                    "hf://ORG/REPO", max_length=1000)
    stream: StrictBool = Field(default=True, description="progress as NDJSON lines")


def error_line(exc: ModelBossError) -> dict[str, Any]:
    return {"status": "failed", "error": {"message": exc.message, "type": exc.error_type,
                                          "param": exc.param, "code": exc.code}}


async def ndjson(reports: AsyncIterator[dict[str, Any]],
                 on_error=error_line) -> AsyncIterator[bytes]:
    try:
        async for report in reports:
            yield orjson.dumps(report) + b"\n"
    except ModelBossError as exc:
        yield orjson.dumps(on_error(exc)) + b"\n"


@router.post("/api/v1/models/pull")
async def pull(request: Request, body: PullRequest) -> Any:
    """Fetch a GGUF model from the Hugging Face Hub into the models folder and serve it. The
    answer (or the stream's last line): ``{"status": "success", "model": ID, "path": ...}``."""
    pulls = coordinator_of(request).pulls
    parse_source(body.source)  # a bad source is a 400 before any line
    if not body.stream:
        return await pulls.pull(body.source)
    return StreamingResponse(ndjson(pulls.follow(body.source)),
                             media_type="application/x-ndjson")


@router.get("/api/v1/pulls")
async def pulls_in_flight(request: Request) -> dict[str, Any]:
    return {"pulls": coordinator_of(request).pulls.status()}


@router.delete("/api/v1/pulls/{pull_id}")
async def cancel_pull(request: Request, pull_id: str) -> dict[str, Any]:
    """Stop a pull; what it downloaded stays in the hub cache for the next pull to resume."""
    return coordinator_of(request).pulls.cancel(pull_id)


@router.delete("/api/v1/models/{model_id:path}")
async def delete_model(request: Request, model_id: str) -> dict[str, Any]:
    """Delete a discovered or pulled model's files (its worker drained and stopped first); a
    model a manifest defines is refused."""
    return await coordinator_of(request).pulls.remove(model_id)
