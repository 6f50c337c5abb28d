"""The load lock a request holds while its cold model loads on the member it named: kept fresh
while the request runs, let go after it, and never kept past it, even when the keeper's
cancel is lost in the store client (the lock would otherwise keep every other member from
loading that model for good)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from model_boss.cluster.cluster import Cluster, Route

LOCK_S = 0.06


class Store:
    """Records each keep; the first renewal hangs and swallows the cancel that ends it."""

    def __init__(self) -> None:
        self.keeps: list[tuple[float, float]] = []  # (when, ttl)
        self.hung = asyncio.Event()
        self.let_go = asyncio.Event()

    async def keep_load(self, model: str, host: str, ttl_s: float) -> bool:
        if ttl_s == LOCK_S and not self.hung.is_set():
            self.hung.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # lost
        self.keeps.append((asyncio.get_running_loop().time(), ttl_s))
        if ttl_s != LOCK_S:
            self.let_go.set()
        return True


async def test_a_lost_cancel_does_not_keep_the_load_lock():
    cluster = Cluster.__new__(Cluster)  # the lock's part alone: no Redis, no members
    cluster.settings = SimpleNamespace(cluster_load_lock_s=LOCK_S, cluster_heartbeat_s=0.01)
    cluster.store = store = Store()
    cluster._background = set()
    async with cluster.holding(Route(None, "loading here", loader="a", model="m")):
        await asyncio.wait_for(store.hung.wait(), 5)  # the keeper's first renewal hangs
    left = asyncio.get_running_loop().time()
    await asyncio.wait_for(store.let_go.wait(), 5)
    await asyncio.sleep(LOCK_S * 2)  # several renewal periods
    renewed_after = [ttl for when, ttl in store.keeps if when > left and ttl == LOCK_S]
    assert renewed_after in ([], [LOCK_S])  # the hung renewal may end; nothing after it
    # and let go: a successful request's lock lingers two heartbeats, then goes
    assert [ttl for _, ttl in store.keeps if ttl != LOCK_S] == [0.02]
