"""Jobs in a real Redis: stored with a TTL once finished, listed by client, cancelled."""

from __future__ import annotations

import asyncio

import pytest

from model_boss.errors import BadRequest
from model_boss.jobs import JobManager, JobStatus, RedisJobStore

pytestmark = pytest.mark.redis


async def test_job_lifecycle_in_redis(redis_url, redis_prefix):
    gate = asyncio.Event()

    async def runner(job, manager):
        if job.body.get("fail"):
            raise BadRequest("bad body", param="x")
        if job.body.get("wait"):
            await gate.wait()
        await manager.update(job, status=JobStatus.RUNNING, progress={"step": 1, "steps": 2})
        return {"echo": job.body}

    store = RedisJobStore(redis_url, prefix=redis_prefix)
    manager = JobManager(store, runner, result_ttl_s=2)
    ok = await manager.submit("/v1/x", {"n": 1}, "alice")
    bad = await manager.submit("/v1/x", {"fail": True}, "bob")
    slow = await manager.submit("/v1/x", {"wait": True}, "alice")
    await asyncio.sleep(0.2)
    done = await manager.get(ok.id)
    assert done.status == JobStatus.SUCCEEDED and done.result == {"echo": {"n": 1}}
    assert done.progress == {"step": 1, "steps": 2}
    failed = await manager.get(bad.id)
    assert failed.status == JobStatus.FAILED and failed.error["param"] == "x"
    assert failed.error["status"] == 400
    assert {j.id for j in await store.list("alice")} == {ok.id, slow.id}
    cancelled = await manager.cancel(slow.id)
    assert cancelled.status == JobStatus.CANCELLED
    ttl = await store._redis.ttl(store._key(ok.id))
    assert 0 < ttl <= 2
    await asyncio.sleep(2.5)
    assert await store.get(ok.id) is None  # finished results expire
    await manager.shutdown()
