"""A member's background loops (the heartbeat, the learned-figures sync) end when the member
stops even if the cancel meant to end them is lost in the store client, as one that lands
just as a Redis command finishes can be: the stop would otherwise wait out its bound."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from model_boss.cluster.membership import Membership
from model_boss.cluster.shared import SharedState

STOP_S = 1.0  # a stop takes a moment, not the wait_for that would end a loop left behind


async def swallow_one_cancel(hung: asyncio.Event) -> None:
    """Hang until cancelled, then carry on as if the cancel never came (the first time)."""
    if hung.is_set():
        return
    hung.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # lost


class Store:
    def __init__(self) -> None:
        self.hung = asyncio.Event()
        self.calls = 0

    async def register(self, record, ttl_s) -> None:
        self.calls += 1
        await swallow_one_cancel(self.hung)

    async def members(self) -> list:
        return []

    async def notify(self, kind, host_id, **fields) -> None:
        pass

    async def leave(self, host_id) -> None:
        pass

    async def share_learned(self, figures) -> None:
        self.calls += 1
        await swallow_one_cancel(self.hung)

    async def learned(self) -> dict:
        return {}


async def test_the_heartbeat_ends_when_its_cancel_is_lost():
    member = Membership.__new__(Membership)  # the heartbeat's part alone
    member.settings = SimpleNamespace(cluster_heartbeat_s=0.01, cluster_member_ttl_s=1)
    member.store = store = Store()
    member.host_id = "a"
    member.view = {}
    member.beats = 0
    member._changed, member._refresh, member._stopping = (asyncio.Event(), asyncio.Event(),
                                                          asyncio.Event())

    async def record():
        return SimpleNamespace(host_id="a")

    member.record = record
    member._tasks = [asyncio.create_task(member._heartbeat())]
    await asyncio.wait_for(store.hung.wait(), 5)  # a beat is in Redis when the stop comes
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(member.stop(), 5)
    assert asyncio.get_running_loop().time() - started < STOP_S
    assert all(task.done() for task in member._tasks)
    calls = store.calls
    await asyncio.sleep(0.05)  # several heartbeat periods: no beat after the stop
    assert store.calls == calls


async def test_the_learned_sync_ends_when_its_cancel_is_lost():
    shared = SharedState.__new__(SharedState)
    shared.store = store = Store()
    shared.learned = SimpleNamespace(models={})
    shared.sync_every_s = 0.01
    shared._dirty = asyncio.Event()
    shared._stopping = False
    shared._tasks = set()

    async def sync() -> None:
        await store.share_learned({})

    shared.sync = sync
    shared._loop = asyncio.create_task(shared._sync_loop())
    await asyncio.wait_for(store.hung.wait(), 5)
    shared.store = SimpleNamespace(share_learned=lambda figures: asyncio.sleep(0))
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(shared.stop(), 5)
    assert asyncio.get_running_loop().time() - started < STOP_S
    assert shared._loop.done()
    calls = store.calls
    await asyncio.sleep(0.05)
    assert store.calls == calls
