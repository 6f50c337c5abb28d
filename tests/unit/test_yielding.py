"""Long work that yields: which running work gives its slot back to a waiting request (a pure
table), the queue's ask (once per run), and a job queued again rather than ended."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from model_boss.jobs.job import JobStatus
from model_boss.jobs.manager import JobManager
from model_boss.jobs.stores import EmbeddedJobStore
from model_boss.scheduling.request import ask_to_yield, yielders
from model_boss.slot_key import model_of

# (blocking copies, waiter's priority, running (copy, priority, id)) -> ids that yield
TABLE = [
    ((), 1, [("wan", 9, "a")], []),  # the planner waits on nothing: nothing yields
    (("wan",), 1, [("wan", 9, "a")], ["a"]),  # less important work on a blocking model
    (("wan",), 9, [("wan", 9, "a")], []),  # as important: it runs on
    (("wan",), 5, [("wan", 2, "a")], []),  # more important: it runs on
    (("wan",), 1, [("ltx", 9, "b")], []),  # on a model the waiter does not wait for
    (("wan", "ltx"), 3, [("wan", 9, "a"), ("ltx", 4, "b"), ("ltx", 2, "c")], ["a", "b"]),
    (("wan#2",), 1, [("wan#2", 9, "a"), ("wan", 9, "b")], ["a"]),  # only the blocking copy
]


@pytest.mark.parametrize("blocking, priority, running, expected", TABLE)
def test_who_yields(blocking, priority, running, expected):
    assert yielders(blocking, priority, running) == expected


def ticket(key: str, priority: int, request_id: str) -> SimpleNamespace:
    return SimpleNamespace(slot=SimpleNamespace(key=key, model_id=model_of(key)),
                           request=SimpleNamespace(priority=priority, request_id=request_id))


def test_the_queue_asks_each_run_once_and_only_work_that_can_yield():
    asked: list[str] = []
    running = {"wan": [ticket("wan", 9, "video"), ticket("wan", 9, "chat")]}
    yieldable = {"video": lambda: asked.append("video")}
    assert ask_to_yield(("wan",), 1, lambda m: running.get(m, []), yieldable) == ["video"]
    assert ask_to_yield(("wan",), 1, lambda m: running.get(m, []), yieldable) == []
    assert asked == ["video"] and yieldable == {}  # the chat (not yieldable) was never asked


def test_work_on_a_second_copy_yields_when_that_copy_blocks():
    asked: list[str] = []
    running = {"wan": [ticket("wan", 9, "first")], "wan#2": [ticket("wan#2", 9, "second")]}
    yieldable = {"first": lambda: asked.append("first"),
                 "second": lambda: asked.append("second")}
    assert ask_to_yield(("wan#2",), 1, lambda k: running.get(k, []), yieldable) == ["second"]
    assert asked == ["second"] and list(yieldable) == ["first"]  # the first copy runs on


async def test_a_requeued_job_runs_again_and_is_not_cancelled():
    runs: list[int] = []
    gate = asyncio.Event()

    async def runner(job, manager):
        runs.append(len(runs))
        if len(runs) == 1:
            await asyncio.sleep(3600)  # the first run is long: it is asked to yield
        await gate.wait()
        return {"run": len(runs)}

    manager = JobManager(EmbeddedJobStore(), runner)
    job = await manager.submit("/v1/videos", {"model": "wan"}, "me")
    await asyncio.sleep(0.01)
    again = await manager.requeue(job.id)
    assert again is not None and again.status is JobStatus.QUEUED and again.yields == 1
    assert (await manager.get(job.id)).status is not JobStatus.CANCELLED
    gate.set()
    for _ in range(100):
        if (await manager.get(job.id)).status is JobStatus.SUCCEEDED:
            break
        await asyncio.sleep(0.01)
    done = await manager.get(job.id)
    assert done.status is JobStatus.SUCCEEDED and done.result == {"run": 2}
    assert runs == [0, 1]
    assert await manager.requeue(job.id) is None  # finished: nothing to requeue


async def test_a_cancel_still_cancels():
    async def runner(job, manager):
        await asyncio.sleep(3600)

    manager = JobManager(EmbeddedJobStore(), runner)
    job = await manager.submit("/v1/videos", {}, "me")
    await asyncio.sleep(0.01)
    assert (await manager.cancel(job.id)).status is JobStatus.CANCELLED
