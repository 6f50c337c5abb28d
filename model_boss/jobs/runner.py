"""JobRunner: runs one job through the serving service and keeps its status current."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from ..catalog import Catalog
from ..scheduling.queue import SlotTicket
from ..slot_key import slot_key
from ..slots.pool import ModelPool
from ..slots.slot import SlotState
from .job import Job, JobStatus
from .manager import JobManager

log = logging.getLogger(__name__)

# how long a job's progress follower may take to end once its work is done; one that has not
# ended by then is left behind: the job finishes all the same. A cancel can be lost: redis-py
# sends a command under asyncio.wait_for when the client has a socket_timeout, and Python
# 3.11's wait_for returns the result instead of raising when a cancel lands as the send ends
# (about a third of the cancels that land mid-command, measured here)
FOLLOWER_END_S = 5.0
# told when a request has been granted a slot (a job follows its work from there)
Dispatched = Callable[[SlotTicket], None]


class Answer(Protocol):
    """What the work returns: a whole body and its media type."""

    body: bytes
    media_type: str


# told how far the work has come (a chat job: {"tokens": n}); kept as the job's progress
Reported = Callable[[dict[str, Any]], None]
# The work itself, injected from the service layer: serve the job's request, calling the
# second argument once a slot has been granted and the third as it makes progress.
Work = Callable[[Job, Dispatched, Reported], Awaitable[Answer]]


class JobRunner:
    """A JobManager's runner: LOADING while the model is cold, RUNNING once a slot is
    granted, progress where the work or the worker reports it (written at most every
    ``progress_interval_s``), timings, then the answer as the result (JSON, or base64 with
    its content type for anything else)."""

    def __init__(self, catalog: Catalog, pool: ModelPool, work: Work,
                 progress_interval_s: float = 0.2) -> None:
        self.catalog = catalog
        self.pool = pool
        self.work = work
        self.progress_interval_s = progress_interval_s

    def _warm(self, model: Any) -> bool:
        entry = self.catalog.find(model) if isinstance(model, str) else None
        slot = self.pool.slots.get(slot_key(entry.manifest.id)) if entry else None
        return slot is not None and slot.state == SlotState.READY

    async def __call__(self, job: Job, manager: JobManager) -> Any:
        if not self._warm(job.body.get("model")):
            await manager.update(job, status=JobStatus.LOADING)
        started = time.monotonic()
        watchers: list[asyncio.Task] = []
        reported: dict[str, Any] = {}
        over = asyncio.Event()  # the work is done: followers stop even if a cancel is lost

        def dispatched(ticket: SlotTicket) -> None:
            job.model = ticket.slot.model_id
            job.timings["waited_s"] = round(time.monotonic() - started, 3)
            watchers.append(asyncio.create_task(
                self._running(manager, job, ticket, reported, over)))

        try:
            answer = await self.work(job, dispatched, reported.update)
        finally:
            over.set()
            await _stopped(job, watchers)
        if reported:  # the last count, written with the result
            job.progress = dict(reported)
        job.timings["run_s"] = round(time.monotonic() - started - job.timings.get(
            "waited_s", 0.0), 3)
        if "json" not in answer.media_type:
            return {"content_type": answer.media_type,
                    "b64": base64.b64encode(answer.body).decode()}
        return orjson.loads(answer.body)

    async def _running(self, manager: JobManager, job: Job, ticket: SlotTicket,
                       reported: dict[str, Any], over: asyncio.Event) -> None:
        """Mark the job running and follow its progress: what the work reports, and what
        the worker does where it reports any (the diffusers worker's denoising steps)."""
        await manager.update(job, status=JobStatus.RUNNING)
        worker_progress = getattr(ticket.slot.backend, "progress", None)
        while not over.is_set():
            await asyncio.sleep(self.progress_interval_s)
            report = {**reported, **(await worker_progress() if worker_progress else {})}
            if report and report != job.progress:
                await manager.update(job, progress=report)


async def _stopped(job: Job, followers: list[asyncio.Task]) -> None:
    """Cancel ``followers`` and give them ``FOLLOWER_END_S`` to end; one still running then
    is logged with where it waits and left behind (the job's outcome does not wait on it)."""
    for follower in followers:
        follower.cancel()
    if not followers:
        return
    ended, running = await asyncio.wait(followers, timeout=FOLLOWER_END_S)
    for follower in ended:  # a progress write that failed: the outcome's write says more
        if not follower.cancelled() and follower.exception() is not None:
            log.debug("job %s: progress not written: %s", job.id, follower.exception())
    for follower in running:
        where = io.StringIO()
        follower.print_stack(file=where)
        log.warning("job %s: its progress follower did not end %gs after its cancel; left "
                    "behind, at:\n%s", job.id, FOLLOWER_END_S, where.getvalue().rstrip())
