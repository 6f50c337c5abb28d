"""A caller that goes away: the guard that stops its work without a task of its own."""

from __future__ import annotations

import asyncio

import pytest

from model_boss.services import ClientDisconnected, Departure, unless_disconnected


async def test_work_is_cancelled_when_the_caller_goes_and_the_task_lives_on():
    gone, stopped = Departure(), asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()
        return "never"

    async def request() -> str:
        with pytest.raises(ClientDisconnected):
            await unless_disconnected(gone, work())
        await asyncio.sleep(0)  # the task is not left cancelled: it may still clean up
        return "cleaned up"

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    gone.set()
    assert await task == "cleaned up"
    assert stopped.is_set() and task.cancelling() == 0


async def test_finished_work_returns_its_result_and_a_later_departure_cancels_nothing():
    gone = Departure()

    async def request() -> str:
        answer = await unless_disconnected(gone, asyncio.sleep(0, result="answer"))
        gone.set()  # the caller goes after the answer: the rest of the request is not cut
        await asyncio.sleep(0.01)
        return answer

    assert await asyncio.create_task(request()) == "answer"


async def test_work_for_a_caller_already_gone_never_starts():
    gone = Departure()
    gone.set()
    started = []

    async def work() -> None:
        started.append(True)

    with pytest.raises(ClientDisconnected):
        await unless_disconnected(gone, work())
    assert not started


async def test_nested_guards_raise_one_disconnect():
    gone = Departure()

    async def inner() -> None:
        await unless_disconnected(gone, asyncio.sleep(30))

    async def request() -> None:
        await unless_disconnected(gone, inner())

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    gone.set()
    with pytest.raises(ClientDisconnected):
        await task
    assert task.cancelling() == 0


async def test_a_cancel_from_elsewhere_stays_a_cancel():
    gone = Departure()
    task = asyncio.create_task(unless_disconnected(gone, asyncio.sleep(30)))
    await asyncio.sleep(0.01)
    task.cancel()  # shutdown, not the caller
    with pytest.raises(asyncio.CancelledError):
        await task
    gone.set()  # nothing guarded is left to cancel


async def test_work_that_swallows_its_cancel_still_ends_as_a_disconnect():
    gone = Departure()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    task = asyncio.create_task(unless_disconnected(gone, stubborn()))
    await asyncio.sleep(0.01)
    gone.set()
    with pytest.raises(ClientDisconnected):
        await task
