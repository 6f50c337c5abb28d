"""Where jobs are kept: in memory (the newest ``max_jobs``) or in Redis with a TTL."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

import orjson

from ..errors import StoreUnavailable
from .job import Job


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
