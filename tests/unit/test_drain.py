"""The daemon's drain (model_boss/slots/drain.py) over plain tasks: what it waits for, what it
cuts, when it stops waiting, its hooks and the hand-off of queued requests."""

from __future__ import annotations

import asyncio
import time

import pytest

from model_boss.slots import drain as drain_module
from model_boss.slots.drain import Drain, ShuttingDown


async def _request(drain: Drain, seconds: float, *, work: bool = True,
                   outcome: list[str] | None = None) -> None:
    """A request as the HTTP edge runs one: registered while it runs; a cut is taken."""
    task = asyncio.current_task()
    assert task is not None
    entry = drain.enter(task, work=work)
    try:
        await asyncio.sleep(seconds)
        if outcome is not None:
            outcome.append("finished")
    except asyncio.CancelledError:
        if not entry.cut or task.uncancel() > 0:
            raise
        if outcome is not None:
            outcome.append("cut")
    finally:
        drain.leave(entry)


async def test_with_nothing_running_it_drains_at_once_and_refuses_from_then_on():
    drain = Drain(grace_s=30)
    assert not drain.draining
    started = time.monotonic()
    await drain.run()
    assert time.monotonic() - started < 0.5
    assert drain.draining and drain.since is not None
    refusal = drain.refusal()
    assert isinstance(refusal, ShuttingDown) and refusal.status_code == 503
    assert refusal.code == "shutting_down" and refusal.headers()["Retry-After"] == "5"
    await drain.run()  # a second run is nothing


async def test_running_work_finishes_within_the_grace_and_reads_are_not_waited_for():
    drain = Drain(grace_s=10)
    work, read = [], []
    tasks = [asyncio.create_task(_request(drain, 0.3, outcome=work)),
             asyncio.create_task(_request(drain, 60, work=False, outcome=read))]
    await asyncio.sleep(0)
    assert drain.running() == 1
    started = time.monotonic()
    await drain.run()
    assert 0.25 < time.monotonic() - started < 3
    assert work == ["finished"] and read == ["cut"]  # the event stream went with the rest
    await asyncio.gather(*tasks)
    assert drain.requests == set()


async def test_past_the_grace_what_runs_is_cut():
    drain = Drain(grace_s=0.2)
    outcome: list[str] = []
    task = asyncio.create_task(_request(drain, 60, outcome=outcome))
    await asyncio.sleep(0)
    started = time.monotonic()
    await drain.run()
    assert 0.15 < time.monotonic() - started < 3
    assert outcome == ["cut"] and task.done() and not task.cancelled()


async def test_force_ends_the_wait_at_once_and_tells_its_hooks_once():
    drain = Drain(grace_s=60)
    told: list[str] = []
    drain.on_force.append(lambda: told.append("hurry"))
    outcome: list[str] = []
    task = asyncio.create_task(_request(drain, 60, outcome=outcome))
    await asyncio.sleep(0)
    running = asyncio.create_task(drain.run())
    await asyncio.sleep(0.1)
    assert not running.done()
    started = time.monotonic()
    drain.force()
    drain.force()
    await running
    assert time.monotonic() - started < 1
    assert outcome == ["cut"] and told == ["hurry"] and drain.forced
    await task


async def test_a_hook_that_hangs_or_fails_does_not_hold_the_drain(monkeypatch, caplog):
    monkeypatch.setattr(drain_module, "HOOK_S", 0.1)
    drain = Drain(grace_s=0)

    async def hangs() -> None:
        await asyncio.sleep(60)

    async def fails() -> None:
        raise RuntimeError("redis is gone")

    drain.on_begin.extend([hangs, fails])
    started = time.monotonic()
    await drain.run()
    assert time.monotonic() - started < 2
    assert "went on without it" in caplog.text and "redis is gone" in caplog.text


@pytest.mark.parametrize("before_its_turn", [True, False])
async def test_a_queued_request_is_handed_off_only_before_its_turn(before_its_turn):
    drain = Drain(grace_s=0.2)
    handed: list[bool] = []

    async def queued() -> None:
        task = asyncio.current_task()
        assert task is not None
        drain.handable[task] = lambda: before_its_turn
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            handed.append(task in drain.handed and task.uncancel() == 0)
        finally:
            drain.handable.pop(task, None)

    task = asyncio.create_task(queued())
    await asyncio.sleep(0)
    await drain.run()
    await asyncio.sleep(0.01)  # the cancel lands in the request's task
    if before_its_turn:
        assert handed == [True]
    else:  # it was not handed: still there, and nobody cut it (it is no HTTP request here)
        assert handed == [] and not task.done()
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
