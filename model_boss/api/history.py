"""The dashboard's timelines: the last hour sampled (``/api/v1/history``) and the last
finished requests (``/api/v1/requests``). Admin routes: the admin key guards them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from .context import coordinator_of
from .errors import OpenAIError, documented

router = APIRouter(tags=["admin"], responses=documented(OpenAIError))


@router.get("/api/v1/history")
async def history(request: Request,
                  minutes: int = Query(default=60, ge=1, le=60,
                                       description="the last this many minutes"),
                  points: int = Query(default=720, ge=10, le=3600,
                                      description="at most this many points per series")
                  ) -> dict[str, Any]:
    """VRAM held per model and outside lease, free VRAM, queue depth and wait, request and
    token rates, the CPU tier, one value per ``step_s``, oldest first; marks for loads,
    evictions, offloads, crashes and lost leases."""
    return coordinator_of(request).history.render(minutes, points=points)


@router.get("/api/v1/requests")
async def requests(request: Request,
                   limit: int = Query(default=100, ge=1, le=1000),
                   model: str | None = Query(default=None, description="only this model"),
                   client: str | None = Query(default=None, description="only this client")
                   ) -> dict[str, Any]:
    """The last finished requests, newest first (no prompt text); where traces are on, each
    row's ``trace_id``, and ``trace_url`` (the config's ``tracing.trace_url``: where the
    dashboard links a trace id, ``{trace_id}`` in it) when set."""
    coord = coordinator_of(request)
    rows = coord.requests.recent(limit, model or None, client or None)
    return {"requests": rows, "trace_url": coord.settings.tracing.trace_url}
