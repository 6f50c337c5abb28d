"""Pacing: arrivals take turns with the work already running (a few per turn of the loop)."""

from __future__ import annotations

import asyncio

from model_boss.api.middleware.pacing import Pacing


def paced(per_turn: int) -> tuple[Pacing, list[int]]:
    begun: list[int] = []

    async def app(scope, receive, send) -> None:
        begun.append(scope["n"])

    return Pacing(app, per_turn=per_turn), begun


async def turns(begun: list[int], until: int, most: int = 50) -> list[int]:
    """How many had begun after each turn of the loop, until ``until`` have."""
    seen = []
    for _ in range(most):
        await asyncio.sleep(0)
        seen.append(len(begun))
        if len(begun) >= until:
            break
    return seen


async def test_a_burst_begins_a_few_per_turn_in_arrival_order():
    pacing, begun = paced(per_turn=4)
    tasks = [asyncio.create_task(pacing({"type": "http", "n": n}, None, None))
             for n in range(10)]
    seen = await turns(begun, 10)
    await asyncio.gather(*tasks)
    assert begun == list(range(10))
    steps = [b - a for a, b in zip([0, *seen], seen, strict=False)]
    assert max(steps) == 4 and len([s for s in steps if s]) == 3, seen


async def test_a_lone_request_begins_in_the_turn_it_arrives():
    pacing, begun = paced(per_turn=4)
    task = asyncio.create_task(pacing({"type": "http", "n": 0}, None, None))
    await asyncio.sleep(0)
    assert begun == [0]
    await task


async def test_a_request_that_goes_while_it_waits_gives_its_turn_to_the_next():
    pacing, begun = paced(per_turn=1)
    tasks = [asyncio.create_task(pacing({"type": "http", "n": n}, None, None))
             for n in range(4)]
    await asyncio.sleep(0)
    assert begun == [0]
    tasks[1].cancel()
    await turns(begun, 3)
    await asyncio.gather(*tasks, return_exceptions=True)
    assert begun == [0, 2, 3] and tasks[1].cancelled()
    assert not pacing._line


async def test_lifespan_and_websocket_scopes_are_not_paced():
    pacing, begun = paced(per_turn=1)
    await pacing({"type": "http", "n": 0}, None, None)
    await pacing({"type": "lifespan", "n": 1}, None, None)  # the turn's one http is used
    assert begun == [0, 1]


async def test_nothing_is_paced_while_nothing_waits_in_the_queue():
    begun: list[int] = []

    async def app(scope, receive, send) -> None:
        begun.append(scope["n"])

    queued = [False]
    pacing = Pacing(app, per_turn=1, busy=lambda: queued[0])
    tasks = [asyncio.create_task(pacing({"type": "http", "n": n}, None, None))
             for n in range(3)]
    await asyncio.sleep(0)
    assert begun == [0, 1, 2]  # all in the turn they came
    queued[0] = True
    tasks += [asyncio.create_task(pacing({"type": "http", "n": n}, None, None))
              for n in range(3, 6)]
    await asyncio.sleep(0)
    assert begun == [0, 1, 2, 3]
    await asyncio.gather(*tasks)
    assert begun == list(range(6))
