"""GPUBoss over a real redis-server: atomic, all-or-nothing, expiring leases."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from model_boss.errors import LeaseUnavailable, StoreUnavailable
from model_boss.gpu import GPUBoss, GPUInfo
from model_boss.gpu.redis_store import RedisLeaseStore

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
GPUS = [GPUInfo(0, "sim-a", 10_512, "declared"), GPUInfo(1, "sim-b", 10_512, "declared")]


def boss(url: str, prefix: str, **kwargs) -> GPUBoss:
    return GPUBoss(RedisLeaseStore(url, prefix=prefix), GPUS, margin_mb=512, **kwargs)


async def leased(b: GPUBoss) -> dict[int, int]:
    return {u.index: u.leased_mb for u in await b.usage()}


@pytest.fixture
async def default_prefix_url(redis_url) -> AsyncIterator[str]:
    """A Redis database of its own, emptied, for clients that use the default key prefix."""
    url = redis_url.rsplit("/", 1)[0] + "/11"
    client = aioredis.from_url(url)
    await client.flushdb()
    yield url
    await client.flushdb()
    await client.aclose()


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
        assert await leased(first) == {0: 9_800, 1: 0}
        assert await leased(second) == {0: 9_800, 1: 0}
    finally:
        await first.close()
        await second.close()


# Each process connects, says "ready", waits for "go" on stdin, then fires its acquires at once.
RACER = textwrap.dedent("""
    import asyncio, sys
    from model_boss.errors import LeaseUnavailable
    from model_boss.gpu import GPUBoss, GPUInfo
    from model_boss.gpu.redis_store import RedisLeaseStore

    async def main(url, prefix):
        b = GPUBoss(RedisLeaseStore(url, prefix=prefix),
                    [GPUInfo(0, "g", 10_512, "declared")], margin_mb=512)
        await b.store.list()  # connected before the start line
        print("ready", flush=True)
        sys.stdin.readline()
        results = await asyncio.gather(
            *[b.acquire(kind="race", allocations={0: 600}, ttl_s=60, heartbeat=False)
              for _ in range(5)], return_exceptions=True)
        assert all(isinstance(r, LeaseUnavailable) for r in results if isinstance(r, Exception))
        print(" ".join(r.id for r in results if not isinstance(r, Exception)), flush=True)
        await b.store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_racing_processes_get_exactly_one_success(redis_url, redis_prefix):
    owner = boss(redis_url, redis_prefix)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = []
    try:
        await owner.acquire(kind="training", allocations={0: 9_000}, heartbeat=False, ttl_s=60)
        for _ in range(4):  # 4 processes × 5 acquires of 600 MB for the last 1000 MB
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-c", RACER, redis_url, redis_prefix, cwd=str(ROOT), env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE))
        for proc in procs:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.strip() == b"ready", (await proc.stderr.read()).decode()
        for proc in procs:
            proc.stdin.write(b"go\n")
        outputs = [await asyncio.wait_for(proc.communicate(), 60) for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * 4, [e.decode() for _, e in outputs]
        granted = [lid for out, _ in outputs for lid in out.decode().split()]
        assert len(granted) == 1
        held = {lease.id: lease for lease in await owner.leases()}
        assert granted[0] in held and held[granted[0]].kind == "race"
        assert await leased(owner) == {0: 9_600, 1: 0}
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await owner.close()


async def test_holder_that_stops_renewing_loses_its_lease(redis_url, redis_prefix):
    quiet, alive, observer = (boss(redis_url, redis_prefix) for _ in range(3))
    try:
        lost = await quiet.acquire(kind="training", vram_mb=4_000, gpu=0, ttl_s=1,
                                   heartbeat=False)
        kept = await alive.acquire(kind="inference", vram_mb=3_000, gpu=1, ttl_s=1)
        assert {lease.id for lease in await observer.leases()} == {lost.id, kept.id}
        await asyncio.sleep(2.0)
        assert {lease.id for lease in await observer.leases()} == {kept.id}
        assert await leased(observer) == {0: 0, 1: 3_000}
        assert await observer.store.renew(lost.id, 5) is None
        await observer.acquire(kind="x", vram_mb=10_000, gpu=0, heartbeat=False)  # room again
    finally:
        for b in (quiet, alive, observer):
            await b.close()


async def test_multi_gpu_acquire_is_all_or_nothing(redis_url, redis_prefix):
    b = boss(redis_url, redis_prefix)
    try:
        await b.acquire(kind="training", allocations={1: 8_000})
        before = await leased(b)
        with pytest.raises(LeaseUnavailable):
            await b.acquire(kind="inference", allocations={0: 5_000, 1: 5_000})
        assert await leased(b) == before == {0: 0, 1: 8_000}
        split = await b.acquire(kind="inference", allocations={0: 5_000, 1: 2_000})
        assert split.gpus == [0, 1]
        assert await leased(b) == {0: 5_000, 1: 10_000}
    finally:
        await b.close()


async def test_release_frees_for_another_process(redis_url, redis_prefix):
    holder, other = boss(redis_url, redis_prefix), boss(redis_url, redis_prefix)
    try:
        taken = await holder.acquire(kind="training", allocations={0: 10_000, 1: 10_000})
        with pytest.raises(LeaseUnavailable):
            await other.acquire(kind="x", vram_mb=1, gpu=1)
        assert await holder.release(taken.id)
        assert not await holder.release(taken.id)
        assert await leased(other) == {0: 0, 1: 0}
        await other.acquire(kind="x", allocations={0: 10_000, 1: 10_000})
    finally:
        await holder.close()
        await other.close()


async def test_from_url_lease_context_manager(default_prefix_url):
    daemon = GPUBoss(RedisLeaseStore(default_prefix_url), GPUS)  # the daemon's default prefix
    outside = GPUBoss.from_url(default_prefix_url, gpus=GPUS, ttl_s=1)
    try:
        async with outside.lease(vram_mb=7_000, kind="training") as lease:
            [held] = await daemon.leases()
            assert held.id == lease.id and held.kind == "training" and held.vram_mb == 7_000
            assert held.holder.endswith(f":{os.getpid()}")
            await asyncio.sleep(2.0)  # twice the TTL: the heartbeat keeps it
            assert [h.id for h in await daemon.leases()] == [lease.id]
        assert await daemon.leases() == []
        assert await leased(daemon) == {0: 0, 1: 0}
    finally:
        await daemon.close()
        await outside.close()


async def test_from_url_without_gpus_uses_the_published_inventory(default_prefix_url):
    daemon = GPUBoss(RedisLeaseStore(default_prefix_url), GPUS)
    early = GPUBoss.from_url(default_prefix_url)
    late = GPUBoss.from_url(default_prefix_url)
    try:
        with pytest.raises(LeaseUnavailable, match="no GPU inventory"):
            await early.acquire(kind="training", vram_mb=100)
        await daemon.publish_inventory()
        lease = await late.acquire(kind="training", vram_mb=10_000, gpu=1)
        assert late.gpus == GPUS
        assert await leased(daemon) == {0: 0, 1: 10_000}
        await late.release(lease.id)
    finally:
        for b in (daemon, early, late):
            await b.close()


async def test_unreachable_redis_is_a_clear_error_without_the_password():
    b = GPUBoss(RedisLeaseStore("redis://:s3cret@127.0.0.1:1/0", timeout_s=2), GPUS)
    with pytest.raises(StoreUnavailable, match="unreachable") as failed:
        await b.acquire(kind="x", allocations={0: 1})
    assert "s3cret" not in failed.value.message and "127.0.0.1:1" in failed.value.message
    await b.close()
