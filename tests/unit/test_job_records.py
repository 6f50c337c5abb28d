"""Job records written by a newer member: a field this version does not know is ignored
(said once in the log), so a cluster upgraded one member at a time keeps its jobs; the
records go through a real Redis, as members share them."""

from __future__ import annotations

import logging

import orjson
import pytest

from model_boss.jobs import job as job_module
from model_boss.jobs.job import Job, JobStatus
from model_boss.jobs.stores import RedisJobStore


def newer_record(job_id: str) -> bytes:
    """What a newer member writes: this version's fields, and two it has never heard of."""
    record = Job(id=job_id, endpoint="/v1/images/generations", body={"prompt": "a cat"},
                 client_id="someone", status=JobStatus.RUNNING, member="host-b",
                 trace={"traceparent": "00-" + "4" * 32 + "-" + "5" * 16 + "-01"})
    return orjson.dumps({**record.public(with_body=True), "checkpoint": {"step": 12},
                         "resumable": True})


@pytest.fixture
def said(monkeypatch):
    monkeypatch.setattr(job_module, "_said_unknown", set())  # as a fresh process


async def test_a_record_from_a_newer_member_loads_and_its_unknown_fields_are_said_once(
        redis_url, redis_prefix, said, caplog):
    store = RedisJobStore(redis_url, prefix=redis_prefix)
    try:
        for job_id in ("job-1", "job-2"):
            await store._redis.set(store._key(job_id), newer_record(job_id))
            await store._redis.zadd(f"{redis_prefix}:jobs", {job_id: 1.0})
        with caplog.at_level(logging.WARNING, logger="model_boss.jobs.job"):
            loaded = await store.get("job-1")
            listed = await store.list(None)
            again = await store.get("job-2")
        assert loaded is not None and again is not None
        assert (loaded.status, loaded.member, loaded.body) == (
            JobStatus.RUNNING, "host-b", {"prompt": "a cat"})
        assert loaded.trace["traceparent"].startswith("00-4444")
        assert sorted(job.id for job in listed) == ["job-1", "job-2"]
        assert not hasattr(loaded, "checkpoint")
        said_lines = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
        # one line per unknown field, however many records carry it
        assert len(said_lines) == 2, said_lines
        assert any("'checkpoint'" in line for line in said_lines)
        assert any("'resumable'" in line for line in said_lines)
    finally:
        await store.close()


def test_a_record_of_this_version_says_nothing(said, caplog):
    record = Job(id="job-3", endpoint="/v1/audio/speech", body={}, client_id="c")
    with caplog.at_level(logging.WARNING, logger="model_boss.jobs.job"):
        assert Job.from_dict(record.public(with_body=True)) == record
    assert not caplog.records
