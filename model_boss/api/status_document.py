"""The status document (``GET /api/v1/status``): the GPUs, slots, spare workers, queue,
catalog, pulls, leases and every model (with or without a slot), read from the coordinator's
parts at one moment. Read-only."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from ..catalog import context_view
from ..scheduling.waiting import queue_status
from ..slot_key import slot_key

if TYPE_CHECKING:
    from ..coordinator import Coordinator


async def status_document(coord: Coordinator,
                          realtime_sessions: list[dict[str, Any]] | None = None,
                          ) -> dict[str, Any]:
    """``realtime_sessions``: the open ``/v1/realtime`` sessions (the services keep them)."""
    usage = await coord.boss.usage()
    leases = await coord.boss.leases()
    queue = queue_status(coord.queue)
    return {
        "time": time.time(),  # the server's clock, for countdowns against unload_at
        "uptime_s": round(time.time() - coord.started_at, 1),
        "lease_store": "redis" if coord.settings.redis_url else "embedded",
        "cluster": {"host_id": coord.cluster.host_id, "url": coord.settings.member_url}
        if coord.cluster else None,
        "gpus": [u.to_dict() for u in usage],
        "slots": coord.pool.status(),
        "spare_workers": coord.pool.spares.status(),
        "worker_templates": coord.pool.templates.status(),
        "queue": queue,
        "client_profiles": {name: profile.model_dump(exclude_none=True)
                            for name, profile in coord.settings.clients.items()},
        "offloaded_mb": coord.pool.offloaded_mb(),
        "catalog": coord.live.status(),
        "pulls": coord.pulls.status(),
        "leases": [lease.to_dict() for lease in leases],
        "models": await model_views(coord, queue["by_model"]),
        "realtime_sessions": realtime_sessions or [],
        "warnings": [w for w in (coord.exposure_warning,) if w],
    }


async def model_views(coord: Coordinator, queued: dict[str, int]) -> list[dict[str, Any]]:
    """Every manifest, slot or not: what it is, how many requests wait for it (``queued``:
    by model), and (for one never loaded, which has no slot) its VRAM estimate."""
    without_slot = [e for e in coord.catalog
                    if e.available and slot_key(e.manifest.id) not in coord.pool.slots]
    # off the event loop: an estimate not yet cached may read the model file
    estimates = await asyncio.to_thread(_estimates, coord, without_slot)
    return [
        {"id": e.manifest.id, "aliases": list(e.manifest.aliases),
         "category": str(e.manifest.category), "backend": str(e.manifest.backend),
         "source": e.manifest.source, **context_view(e.manifest),
         "parallel": e.manifest.concurrency, "pin": e.manifest.pin, "base": e.manifest.base,
         "available": e.available, "unavailable_reason": e.unavailable_reason,
         "queued": queued.get(e.manifest.id, 0),
         "vram_estimate": estimates.get(e.manifest.id)}
        for e in coord.catalog
    ]


def _estimates(coord: Coordinator, entries: list) -> dict[str, dict]:
    found = {}
    for entry in entries:
        with contextlib.suppress(Exception):  # an unreadable file has no estimate to show
            found[entry.manifest.id] = coord.pool.estimate(entry).to_dict()
    return found
