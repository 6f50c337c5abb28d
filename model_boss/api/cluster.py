"""``GET /api/v1/cluster``: the members sharing this coordinator's Redis, and where each
model is (which member, which state and tier)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .context import coordinator_of

router = APIRouter(tags=["cluster"])


@router.get("/api/v1/cluster")
async def cluster(request: Request) -> dict[str, Any]:
    coord = coordinator_of(request)
    if coord.cluster is None:
        return {"enabled": False, "host_id": None, "members": [], "models": {}}
    return await coord.cluster.describe()
