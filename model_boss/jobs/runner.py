"""JobRunner: runs one job through the serving service and keeps its status current."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from ..catalog import Catalog
from ..scheduling.queue import SlotTicket
from ..slots.pool import ModelPool
from ..slots.slot import SlotState
from .job import Job, JobStatus
from .manager import JobManager

# told when a request has been granted a slot (a job follows its work from there)
Dispatched = Callable[[SlotTicket], None]


class Answer(Protocol):
    """What the work returns: a whole body and its media type."""

    body: bytes
    media_type: str


# The work itself, injected from the service layer: serve the job's request, calling the
# second argument once a slot has been granted.
Work = Callable[[Job, Dispatched], Awaitable[Answer]]


class JobRunner:
    """A JobManager's runner: LOADING while the model is cold, RUNNING once a slot is
    granted, progress where the worker reports it, timings, then the answer as the result
    (JSON, or base64 with its content type for anything else)."""

    def __init__(self, catalog: Catalog, pool: ModelPool, work: Work,
                 progress_interval_s: float = 0.2) -> None:
        self.catalog = catalog
        self.pool = pool
        self.work = work
        self.progress_interval_s = progress_interval_s

    def _warm(self, model: Any) -> bool:
        entry = self.catalog.find(model) if isinstance(model, str) else None
        slot = self.pool.slots.get(entry.manifest.id) if entry else None
        return slot is not None and slot.state == SlotState.READY

    async def __call__(self, job: Job, manager: JobManager) -> Any:
        if not self._warm(job.body.get("model")):
            await manager.update(job, status=JobStatus.LOADING)
        started = time.monotonic()
        watchers: list[asyncio.Task] = []

        def dispatched(ticket: SlotTicket) -> None:
            job.model = ticket.slot.model_id
            job.timings["waited_s"] = round(time.monotonic() - started, 3)
            watchers.append(asyncio.create_task(self._running(manager, job, ticket)))

        try:
            answer = await self.work(job, dispatched)
        finally:
            for watcher in watchers:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
        job.timings["run_s"] = round(time.monotonic() - started - job.timings.get(
            "waited_s", 0.0), 3)
        if "json" not in answer.media_type:
            return {"content_type": answer.media_type,
                    "b64": base64.b64encode(answer.body).decode()}
        return orjson.loads(answer.body)

    async def _running(self, manager: JobManager, job: Job, ticket: SlotTicket) -> None:
        """Mark the job running and, where the worker reports progress, follow it."""
        await manager.update(job, status=JobStatus.RUNNING)
        progress = getattr(ticket.slot.backend, "progress", None)
        if progress is None:
            return
        while True:
            await asyncio.sleep(self.progress_interval_s)
            report = await progress()
            if report and report != job.progress:
                await manager.update(job, progress=report)
