"""Jobs: submit long work, poll it, cancel it. Stored in Redis (with a TTL) or embedded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import orjson

from .errors import CapacityExceeded, ModelBossError, NotFound, StoreUnavailable

log = logging.getLogger(__name__)


class JobStatus(StrEnum):
    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}


@dataclass(slots=True)
class Job:
    id: str
    endpoint: str
    body: dict[str, Any]
    client_id: str
    status: JobStatus = JobStatus.QUEUED
    model: str | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def public(self, with_body: bool = False) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        if not with_body:
            data.pop("body")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        data = dict(data)
        data["status"] = JobStatus(data["status"])
        return cls(**data)


class JobStore(Protocol):
    async def put(self, job: Job, ttl_s: float | None) -> None: ...

    async def get(self, job_id: str) -> Job | None: ...

    async def list(self, client_id: str | None) -> list[Job]: ...

    async def close(self) -> None: ...


class EmbeddedJobStore:
    """Newest ``max_jobs`` jobs in memory; finished ones dropped after their TTL."""

    def __init__(self, max_jobs: int = 1000) -> None:
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[str, tuple[Job, float | None]] = OrderedDict()

    def _expire(self) -> None:
        now = time.time()
        for job_id in [j for j, (_, exp) in self._jobs.items() if exp is not None and exp <= now]:
            del self._jobs[job_id]
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)

    async def put(self, job: Job, ttl_s: float | None) -> None:
        self._jobs[job.id] = (job, time.time() + ttl_s if ttl_s else None)
        self._jobs.move_to_end(job.id)
        self._expire()

    async def get(self, job_id: str) -> Job | None:
        self._expire()
        found = self._jobs.get(job_id)
        return found[0] if found else None

    async def list(self, client_id: str | None) -> list[Job]:
        self._expire()
        return [j for j, _ in self._jobs.values() if client_id is None or j.client_id == client_id]

    async def close(self) -> None:
        return None


class RedisJobStore:
    """Jobs as JSON under ``<prefix>:job:<id>`` with a TTL, indexed in a sorted set."""

    def __init__(self, url: str, prefix: str = "model-boss", max_jobs: int = 1000) -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._errors = redis.RedisError
        self.prefix = prefix
        self.max_jobs = max_jobs

    def _key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    async def put(self, job: Job, ttl_s: float | None) -> None:
        index = f"{self.prefix}:jobs"
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._key(job.id), orjson.dumps(job.public(with_body=True)),
                         ex=int(ttl_s) if ttl_s else None)
                pipe.zadd(index, {job.id: job.created_at})
                pipe.zremrangebyrank(index, 0, -self.max_jobs - 1)
                await pipe.execute()
        except self._errors as exc:
            raise StoreUnavailable(f"job store: Redis unreachable: {exc}") from exc

    async def get(self, job_id: str) -> Job | None:
        try:
            raw = await self._redis.get(self._key(job_id))
        except self._errors as exc:
            raise StoreUnavailable(f"job store: Redis unreachable: {exc}") from exc
        return Job.from_dict(orjson.loads(raw)) if raw else None

    async def list(self, client_id: str | None) -> list[Job]:
        try:
            ids = await self._redis.zrange(f"{self.prefix}:jobs", 0, -1)
            raws = await self._redis.mget([self._key(i.decode()) for i in ids]) if ids else []
        except self._errors as exc:
            raise StoreUnavailable(f"job store: Redis unreachable: {exc}") from exc
        jobs = [Job.from_dict(orjson.loads(r)) for r in raws if r]
        return [j for j in jobs if client_id is None or j.client_id == client_id]

    async def close(self) -> None:
        await self._redis.aclose()


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

    async def submit(self, endpoint: str, body: dict[str, Any], client_id: str) -> Job:
        if len(self._tasks) >= self.max_active:
            raise CapacityExceeded("too many active jobs", retry_after_s=10, code="queue_full")
        job = Job(id="job-" + uuid.uuid4().hex[:20], endpoint=endpoint, body=body,
                  client_id=client_id)
        await self.store.put(job, None)
        task = asyncio.create_task(self._run(job), name=job.id)
        self._tasks[job.id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(job.id, None))
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
        await self.update(job, status=status, finished_at=time.time(), **fields)

    async def get(self, job_id: str) -> Job:
        job = await self.store.get(job_id)
        if job is None:
            raise NotFound(f"job '{job_id}' does not exist (or its result has expired)",
                           code="job_not_found")
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
