"""JobManager: owns the job tasks; each runs the runner and records its outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import CapacityExceeded, JobNotFound, ModelBossError
from .job import FINISHED, Job, JobStatus
from .stores import JobStore

log = logging.getLogger(__name__)


Runner = Callable[[Job, "JobManager"], Awaitable[Any]]


class JobManager:
    """Owns the job tasks; each job runs ``runner`` and records its outcome."""

    def __init__(self, store: JobStore, runner: Runner, *, result_ttl_s: float = 3600,
                 max_active: int = 1000) -> None:
        self.store = store
        self.runner = runner
        self.result_ttl_s = result_ttl_s
        self.max_active = max_active
        self._tasks: dict[str, asyncio.Task] = {}
        self._yielding: set[str] = set()  # jobs cancelled to be queued again, not ended

    async def start(self) -> None:
        """Begin taking work (a manager whose jobs wait elsewhere, on a stream, does)."""

    async def submit(self, endpoint: str, body: dict[str, Any], client_id: str, *,
                     trace: dict[str, str] | None = None) -> Job:
        """Take a job; ``trace`` is its submit's trace context, kept to link its run to."""
        if len(self._tasks) >= self.max_active:
            raise CapacityExceeded("too many active jobs", retry_after_s=10, code="queue_full")
        job = Job(id="job-" + uuid.uuid4().hex[:20], endpoint=endpoint, body=body,
                  client_id=client_id, trace=trace or {})
        await self.store.put(job, None)
        self._start(job)
        return job

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._run(job), name=job.id)
        self._tasks[job.id] = task
        task.add_done_callback(lambda t: self._tasks.pop(job.id, None)
                               if self._tasks.get(job.id) is t else None)

    async def requeue(self, job_id: str) -> Job | None:
        """The job gives its slot back and waits in the queue again (it yields to more
        important work): its run is cancelled (a worker stops at its next step) and started
        over, its progress reset, ``yields`` counted. None when it is no longer running."""
        task = self._tasks.get(job_id)
        if task is None or task.done():
            return None
        self._yielding.add(job_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        job = await self.get(job_id)
        if job.status in FINISHED:  # it ended before the cancel landed
            self._yielding.discard(job_id)
            return job
        await self.update(job, status=JobStatus.QUEUED, progress={}, yields=job.yields + 1)
        self._yielding.discard(job_id)
        self._start(job)
        return job

    async def update(self, job: Job, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(job, key, value)
        await self.store.put(job, self.result_ttl_s if job.status in FINISHED else None)

    async def _run(self, job: Job) -> None:
        started = time.monotonic()
        try:
            result = await self.runner(job, self)
        except asyncio.CancelledError:
            if job.id not in self._yielding:
                with contextlib.suppress(Exception):
                    await self.update(job, status=JobStatus.CANCELLED, finished_at=time.time())
            raise
        except ModelBossError as exc:
            await self._finish(job, started, JobStatus.FAILED,
                               error={**exc.envelope()["error"], "status": exc.status_code})
        except Exception as exc:  # a job never takes the daemon down
            log.exception("job %s failed", job.id)
            await self._finish(job, started, JobStatus.FAILED,
                               error={"message": str(exc), "type": "server_error",
                                      "param": None, "code": "job_failed", "status": 500})
        else:
            await self._finish(job, started, JobStatus.SUCCEEDED, result=result)

    async def _finish(self, job: Job, started: float, status: JobStatus, **fields: Any) -> None:
        job.timings["total_s"] = round(time.monotonic() - started, 3)
        try:
            await self.update(job, status=status, finished_at=time.time(), **fields)
        except Exception:  # the store is away: said here, not lost in a task nobody awaits
            log.exception("job %s: its outcome (%s) could not be written", job.id, status)

    async def get(self, job_id: str) -> Job:
        job = await self.store.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def cancel(self, job_id: str) -> Job:
        job = await self.get(job_id)
        task = self._tasks.get(job_id)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            job = await self.get(job_id)
        return job

    async def shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(BaseException):
                await task
        await self.store.close()
