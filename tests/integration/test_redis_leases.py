"""GPUBoss over a real redis-server: atomic, all-or-nothing, expiring leases."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from model_boss.errors import LeaseUnavailable
from model_boss.gpu import GPUBoss, GPUInfo
from model_boss.gpu.redis_store import RedisLeaseStore

pytestmark = pytest.mark.redis

GPUS = [GPUInfo(0, "sim-a", 10_512, "declared"), GPUInfo(1, "sim-b", 10_512, "declared")]


def boss(url: str, prefix: str, **kwargs) -> GPUBoss:
    return GPUBoss(RedisLeaseStore(url, prefix=prefix), GPUS, margin_mb=512, **kwargs)


async def test_racing_acquirers_get_exactly_one_success(redis_url, redis_prefix):
    first, second = boss(redis_url, redis_prefix), boss(redis_url, redis_prefix)
    try:
        await first.acquire(kind="training", allocations={0: 9_000})  # 1000 MB left
        results = await asyncio.gather(
            *[b.acquire(kind="inference", allocations={0: 800}) for b in (first, second)
              for _ in range(5)], return_exceptions=True)
        granted = [r for r in results if not isinstance(r, Exception)]
        refused = [r for r in results if isinstance(r, LeaseUnavailable)]
        assert len(granted) == 1 and len(refused) == 9
        assert (await first.usage())[0].leased_mb == 9_800
    finally:
        await first.close()
        await second.close()


def test_racing_processes_get_exactly_one_success(redis_url, redis_prefix):
    script = textwrap.dedent(f"""
        import asyncio, sys
        from model_boss.errors import LeaseUnavailable
        from model_boss.gpu import GPUBoss, GPUInfo
        from model_boss.gpu.redis_store import RedisLeaseStore

        async def main():
            b = GPUBoss(RedisLeaseStore({redis_url!r}, prefix={redis_prefix!r}),
                        [GPUInfo(0, "g", 10_512, "declared")], margin_mb=512, ttl_s=60)
            await asyncio.sleep(float(sys.argv[1]))
            try:
                await b.acquire(kind="race", allocations={{0: 6_000}}, heartbeat=False)
                print("granted")
            except LeaseUnavailable:
                print("refused")
            await b.store.close()

        asyncio.run(main())
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, "0.5"], stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outputs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outputs == ["granted", "refused", "refused", "refused"]


async def test_holder_that_stops_renewing_loses_its_lease(redis_url, redis_prefix):
    quiet, alive, observer = (boss(redis_url, redis_prefix) for _ in range(3))
    try:
        lost = await quiet.acquire(kind="training", vram_mb=4_000, gpu=0, ttl_s=1,
                                   heartbeat=False)
        kept = await alive.acquire(kind="inference", vram_mb=3_000, gpu=1, ttl_s=1)
        assert {lease.id for lease in await observer.leases()} == {lost.id, kept.id}
        await asyncio.sleep(2.0)
        assert {lease.id for lease in await observer.leases()} == {kept.id}
        usage = {u.index: u.leased_mb for u in await observer.usage()}
        assert usage == {0: 0, 1: 3_000}
        assert await observer.store.renew(lost.id, 5) is None
    finally:
        for b in (quiet, alive, observer):
            await b.close()


async def test_multi_gpu_acquire_is_all_or_nothing(redis_url, redis_prefix):
    b = boss(redis_url, redis_prefix)
    try:
        await b.acquire(kind="training", allocations={1: 8_000})
        before = {u.index: u.leased_mb for u in await b.usage()}
        with pytest.raises(LeaseUnavailable):
            await b.acquire(kind="inference", allocations={0: 5_000, 1: 5_000})
        assert {u.index: u.leased_mb for u in await b.usage()} == before
        split = await b.acquire(kind="inference", allocations={0: 5_000, 1: 2_000})
        assert split.gpus == [0, 1]
        assert {u.index: u.leased_mb for u in await b.usage()} == {0: 5_000, 1: 10_000}
    finally:
        await b.close()


async def test_lease_context_manager_and_published_inventory(redis_url, redis_prefix):
    daemon = boss(redis_url, redis_prefix)
    await daemon.publish_inventory()
    outside = GPUBoss.from_url(redis_url)
    outside.store = RedisLeaseStore(redis_url, prefix=redis_prefix)
    try:
        async with outside.lease(vram_mb=7_000, kind="training") as lease:
            assert [g.index for g in outside.gpus] == [0, 1]
            held = {lease.id: lease for lease in await daemon.leases()}
            assert held[lease.id].kind == "training" and held[lease.id].vram_mb == 7_000
        assert await daemon.leases() == []
    finally:
        await daemon.close()
        await outside.close()


async def test_unreachable_redis_is_a_clear_error():
    from model_boss.errors import StoreUnavailable

    b = boss("redis://127.0.0.1:1/0", "x")
    with pytest.raises(StoreUnavailable, match="unreachable"):
        await b.acquire(kind="x", allocations={0: 1})
    await b.store.close()
