"""The LeaseStore contract, held by the embedded store and by Redis (a real redis-server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from model_boss.gpu import EmbeddedLeaseStore, Lease, LeaseStore
from model_boss.gpu.lease import new_lease_id

LIMITS = {0: 2_000, 1: 1_000}


@pytest.fixture(params=["embedded", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request) -> AsyncIterator[LeaseStore]:
    if request.param == "embedded":
        made: LeaseStore = EmbeddedLeaseStore()
    else:
        from model_boss.gpu.redis_store import RedisLeaseStore

        made = RedisLeaseStore(request.getfixturevalue("redis_url"),
                               prefix=request.getfixturevalue("redis_prefix"))
    yield made
    await made.close()


def lease(allocations: dict[int, int], ttl_s: float = 30.0) -> Lease:
    return Lease(id=new_lease_id(), holder="test", kind="x", allocations=allocations,
                 ttl_s=ttl_s)


async def leased(store: LeaseStore) -> dict[int, int]:
    totals = dict.fromkeys(LIMITS, 0)
    for held in await store.list():
        for gpu, mb in held.allocations.items():
            totals[gpu] += mb
    return totals


async def test_racing_acquires_never_overcommit(store):
    results = await asyncio.gather(*[store.acquire(lease({0: 300}), LIMITS) for _ in range(20)])
    assert results.count(True) == 6  # 6 × 300 = 1800 <= 2000 < 7 × 300
    assert await leased(store) == {0: 1_800, 1: 0}


async def test_grant_sets_expiry_from_the_store_clock(store):
    taken = lease({0: 100}, ttl_s=20)
    before = time.time()
    assert await store.acquire(taken, LIMITS)
    assert before + 19 < taken.expires_at < time.time() + 21
    [listed] = await store.list()
    assert listed.id == taken.id and listed.allocations == {0: 100}
    assert listed.expires_at == pytest.approx(taken.expires_at, abs=1e-3)


async def test_multi_gpu_acquire_is_all_or_nothing(store):
    assert await store.acquire(lease({1: 900}), LIMITS)
    assert not await store.acquire(lease({0: 500, 1: 500}), LIMITS)  # GPU 1 is short
    assert await leased(store) == {0: 0, 1: 900}
    assert not await store.acquire(lease({0: 10, 7: 10}), LIMITS)  # GPU 7 has no limit
    assert await leased(store) == {0: 0, 1: 900}
    assert await store.acquire(lease({0: 500, 1: 100}), LIMITS)
    assert await leased(store) == {0: 500, 1: 1_000}


async def test_expired_lease_frees_its_vram_and_cannot_be_renewed(store):
    lapsing = lease({0: 2_000}, ttl_s=0.3)
    assert await store.acquire(lapsing, LIMITS)
    assert not await store.acquire(lease({0: 1}), LIMITS)
    await asyncio.sleep(0.6)
    assert await store.list() == []
    assert await store.renew(lapsing.id, 30) is None
    assert await store.acquire(lease({0: 2_000}), LIMITS)


async def test_renew_extends_and_release_frees(store):
    kept = lease({0: 1_500}, ttl_s=0.4)
    assert await store.acquire(kept, LIMITS)
    first_expiry = kept.expires_at
    renewed = await store.renew(kept.id, 5)
    assert renewed is not None and renewed.ttl_s == 5
    assert renewed.expires_at > first_expiry + 4
    await asyncio.sleep(0.6)  # past the first TTL
    assert [held.id for held in await store.list()] == [kept.id]
    assert await store.release(kept.id)
    assert not await store.release(kept.id)
    assert await store.renew(kept.id, 5) is None
    assert await leased(store) == {0: 0, 1: 0}


async def test_inventory_round_trip(store):
    assert await store.inventory() == []
    gpus = [{"index": 0, "name": "sim", "vram_mb": 2_512, "source": "declared"}]
    await store.publish_inventory(gpus)
    assert await store.inventory() == gpus


async def test_reassert_puts_a_lost_lease_back_under_its_own_id(store):
    kept = Lease(id=new_lease_id(), holder="host-a:1", kind="inference",
                 allocations={0: 1_200, 1: 300}, priority=2, ttl_s=20, note="m",
                 address="10.0.0.7")
    assert await store.acquire(kept, LIMITS)
    assert await store.release(kept.id)  # the store lost it (Redis restarted)
    assert await store.reassert(kept, LIMITS)
    [back] = await store.list()
    assert (back.id, back.holder, back.kind, back.allocations, back.priority, back.ttl_s,
            back.note, back.address) == (kept.id, "host-a:1", "inference",
                                         {0: 1_200, 1: 300}, 2, 20, "m", "10.0.0.7")
    assert back.expires_at == pytest.approx(kept.expires_at, abs=1e-3)
    assert kept.expires_at > time.time() + 19
    assert await store.renew(kept.id, 20) is not None
    assert await store.reassert(kept, LIMITS)  # already there: replaced, not counted twice
    assert await leased(store) == {0: 1_200, 1: 300}


async def test_reassert_is_refused_when_the_vram_was_taken(store):
    lost = lease({0: 1_500, 1: 100})
    assert await store.acquire(lost, LIMITS)
    assert await store.release(lost.id)
    taken = lease({0: 1_000})
    assert await store.acquire(taken, LIMITS)
    assert not await store.reassert(lost, LIMITS)  # GPU 0 would hold 2 500 of 2 000 MB
    assert [held.id for held in await store.list()] == [taken.id]
    assert await leased(store) == {0: 1_000, 1: 0}
    assert not await store.reassert(lease({7: 1}), LIMITS)  # no such GPU
