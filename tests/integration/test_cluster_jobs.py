"""JobStreams against a real Redis: a dead consumer's entry is re-claimed after its idle
time, a job finishes once however many runs try to finish it, a job for a model warm on
another member is left to it, and the member a job is submitted to checks it first."""

from __future__ import annotations

import asyncio

import pytest

from model_boss.cluster.jobs import ANY, JobStreams, StreamJobManager
from model_boss.jobs import Job, JobStatus, RedisJobStore
from tests.unit.fakes import coordinator, manifest, started_client

pytestmark = pytest.mark.redis


async def test_reclaim_and_exactly_once(redis_url, redis_prefix):
    dead = JobStreams(redis_url, "dead", prefix=redis_prefix)
    alive = JobStreams(redis_url, "alive", prefix=redis_prefix)
    store = RedisJobStore(redis_url, prefix=redis_prefix)
    try:
        job = Job(id="job-1", endpoint="/v1/chat/completions", body={"model": "m"},
                  client_id="c")
        assert await dead.write(job, None)
        await dead.add("m", job.id)
        [(taken, job_id)] = await dead.take(["m"], None)
        assert job_id == "job-1"
        assert await alive.take(["m"], None) == []  # delivered once
        assert await alive.reclaim(["m"], idle_s=60) == []  # not idle long enough
        [(claimed, job_id)] = await alive.reclaim(["m"], idle_s=0)
        assert job_id == "job-1" and claimed.entry == taken.entry

        job.status, job.member, job.result = JobStatus.SUCCEEDED, "alive", {"n": 1}
        assert await alive.write(job, 60, claimed)
        late = Job(id="job-1", endpoint=job.endpoint, body=job.body, client_id="c",
                   status=JobStatus.SUCCEEDED, member="dead", result={"n": 2})
        assert not await dead.write(late, 60, taken)  # the second finish is refused
        running = Job(id="job-1", endpoint=job.endpoint, body=job.body, client_id="c",
                      status=JobStatus.RUNNING)
        assert not await dead.write(running, None)  # nor may a finished job run again
        stored = await store.get("job-1")
        assert stored.status == JobStatus.SUCCEEDED and stored.member == "alive"
        assert stored.result == {"n": 1}
        pending = await alive._redis.xpending(alive.stream("m"), "members")
        assert pending["pending"] == 0
    finally:
        for closing in (dead, alive, store):
            await closing.close()


async def test_give_back_makes_the_job_takeable_at_once(redis_url, redis_prefix):
    leaving = JobStreams(redis_url, "leaving", prefix=redis_prefix)
    other = JobStreams(redis_url, "other", prefix=redis_prefix)
    try:
        job = Job(id="job-2", endpoint="/v1/completions", body={}, client_id="c")
        await leaving.write(job, None)
        await leaving.add("_any", job.id)
        [(taken, _)] = await leaving.take(["_any"], None)
        await leaving.give_back(taken, job.id)
        [(again, job_id)] = await other.take(["_any"], None)
        assert job_id == "job-2" and again.entry != taken.entry
    finally:
        await leaving.close()
        await other.close()


async def test_a_job_for_a_model_warm_on_another_member_is_left_to_it(redis_url, redis_prefix):
    """A blocking read names its streams before it waits: an entry read for a model that
    meanwhile warmed on another member goes back on its stream, unrun, for that member."""
    ran: list[str] = []

    async def runner(job: Job, _manager) -> dict:
        ran.append(job.id)
        return {}

    def manager(host: str, here: set[str], elsewhere: set[str]) -> StreamJobManager:
        return StreamJobManager(
            RedisJobStore(redis_url, prefix=redis_prefix), runner,
            JobStreams(redis_url, host, prefix=redis_prefix),
            model_of=lambda job: job.body["model"], models=lambda: ["m"],
            warm_here=lambda: here, warm_elsewhere=lambda: elsewhere,
            claim_s=60, keep_s=0.1)

    cold, warm = manager("cold", set(), {"m"}), manager("warm", {"m"}, set())
    try:
        job = await cold.submit("/v1/chat/completions", {"model": "m"}, "c")
        found = await cold.streams.take(["m"], None)  # the stale list still named "m"
        await cold._start_all(found)
        assert ran == [] and cold._tasks == {} and cold._taken == {}
        assert (await cold.get(job.id)).status == JobStatus.QUEUED
        again = await warm.streams.take(["m"], None)
        assert [job_id for _, job_id in again] == [job.id]
        await warm._start_all(again)
        await asyncio.gather(*warm._tasks.values())
        finished = await warm.get(job.id)
        assert ran == [job.id] and finished.status == JobStatus.SUCCEEDED
        assert finished.member == "warm"
        pending = await warm.streams._redis.xpending(warm.streams.stream("m"), "members")
        assert pending["pending"] == 0
    finally:
        for each in (cold, warm):
            await each.streams.close()
            await each.store.close()



async def test_the_member_a_job_is_submitted_to_checks_it_first(tmp_path, redis_url,
                                                                 redis_prefix):
    """A job is checked where it is submitted, before it reaches a stream: refused with its
    live request's error, it is on none; a good one waits on its model's stream. (The
    member's take loop is not started: the job is only to be found there.)"""
    coord, _ = coordinator(tmp_path, [manifest("m")])
    streams = JobStreams(redis_url, "a", prefix=redis_prefix)
    hi = [{"role": "user", "content": "hi"}]
    async with started_client(coord) as client:
        coord.jobs = StreamJobManager(
            RedisJobStore(redis_url, prefix=redis_prefix), coord.jobs.runner, streams,
            model_of=lambda job: job.body.get("model", ANY), models=lambda: ["m", ANY],
            warm_here=set, warm_elsewhere=set, claim_s=60, keep_s=0.1)
        for body, status, param in (({"model": "nope", "messages": hi}, 404, "model"),
                                    ({"model": "m", "stream": True, "messages": hi}, 400,
                                     "stream")):
            refused = await client.post("/api/v1/jobs", json={
                "endpoint": "/v1/chat/completions", "body": body})
            assert (refused.status_code, refused.json()["error"]["param"]) == (status, param)
        for model in ("nope", "m", ANY):
            assert await streams._redis.xlen(streams.stream(model)) == 0
        accepted = await client.post("/api/v1/jobs", json={
            "endpoint": "/v1/chat/completions", "body": {"model": "m", "messages": hi}})
        assert accepted.status_code == 202, accepted.text
        [(_, job_id)] = await streams.take(["m"], None)
        assert job_id == accepted.json()["id"]
