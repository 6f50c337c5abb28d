"""A real redis-server restarted without persistence: leases, inventory and config come back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
import redis.asyncio as aioredis

from model_boss.api.app import create_app
from model_boss.errors import StoreUnavailable
from model_boss.gpu import GPUBoss, GPUInfo, Lease
from model_boss.gpu.redis_store import RedisLeaseStore
from model_boss.runtime_config import REDIS_KEY, RuntimeConfig, RuntimeValues
from tests.conftest import RedisServer
from tests.unit.fakes import coordinator, manifest

pytestmark = pytest.mark.redis

GPUS = [GPUInfo(0, "sim-a", 10_512, "declared"), GPUInfo(1, "sim-b", 10_512, "declared")]
LIMIT_MB = 10_000  # per GPU: capacity minus the 512 MB margin
TTL_S = 1.5  # beats every 0.5 s


def boss(url: str, ttl_s: float = TTL_S) -> GPUBoss:
    return GPUBoss(RedisLeaseStore(url), GPUS, margin_mb=512, ttl_s=ttl_s)


def recording(b: GPUBoss) -> list[tuple[Lease, str]]:
    lost: list[tuple[Lease, str]] = []
    b.on_lease_lost = lambda lease, reason: lost.append((lease, reason))
    return lost


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {within_s}s"
        await asyncio.sleep(0.1)


async def run_id(url: str) -> str:
    client = aioredis.from_url(url)
    try:
        return (await client.info("server"))["run_id"]
    finally:
        await client.aclose()


async def stored_config(url: str) -> dict | None:
    client = aioredis.from_url(url)
    try:
        raw = await client.get(REDIS_KEY)
    finally:
        await client.aclose()
    return json.loads(raw) if raw else None


async def stored_leases(url: str) -> dict[str, dict[int, int]]:
    store = RedisLeaseStore(url)
    try:
        return {lease.id: lease.allocations for lease in await store.list()}
    finally:
        await store.close()


def within_limits(leases: dict[str, dict[int, int]]) -> bool:
    used: dict[int, int] = {}
    for allocations in leases.values():
        for gpu, mb in allocations.items():
            used[gpu] = used.get(gpu, 0) + mb
    return all(mb <= LIMIT_MB for mb in used.values())


async def test_leases_inventory_and_config_survive_a_restart(redis_server: RedisServer):
    url = redis_server.url
    daemon = boss(url)
    lost = recording(daemon)
    runtime = RuntimeConfig(RuntimeValues(), redis_url=url, keep_interval_s=0.3)
    late = GPUBoss.from_url(url)  # no GPUs of its own: it needs the published inventory
    try:
        await daemon.publish_inventory()
        first = await daemon.acquire(kind="inference", allocations={0: 6_000}, priority=2)
        split = await daemon.acquire(kind="diffusion", allocations={0: 1_000, 1: 3_000})
        await runtime.restore()
        await runtime.update({"allowCloudFallback": False})
        before = await run_id(url)

        await asyncio.to_thread(redis_server.restart)

        assert await run_id(url) != before  # a new, empty redis-server
        expected = {first.id: {0: 6_000}, split.id: {0: 1_000, 1: 3_000}}

        async def all_back() -> bool:
            return (await stored_leases(url) == expected
                    and await daemon.store.inventory() == [g.to_dict() for g in GPUS]
                    and await stored_config(url) == {"allowCloudFallback": False})

        await eventually(all_back, within_s=3 * TTL_S)
        assert lost == [] and daemon.holds(first.id) and daemon.holds(split.id)
        assert runtime.allow_cloud_fallback is False
        [back] = [lease for lease in await daemon.leases() if lease.id == first.id]
        assert (back.holder, back.kind, back.priority) == (daemon.holder, "inference", 2)
        await asyncio.sleep(2 * TTL_S)  # renewed, not merely re-written once
        assert await stored_leases(url) == expected
        taken = await late.acquire(kind="training", vram_mb=LIMIT_MB - 7_000, gpu=0)
        assert late.gpus == GPUS
        assert within_limits(await stored_leases(url))
        await late.release(taken.id)
    finally:
        await runtime.close()
        await late.close()
        await daemon.close()


async def test_lease_taken_by_another_holder_before_reassertion_is_lost(
        redis_server: RedisServer):
    url = redis_server.url
    holder = boss(url, ttl_s=30)  # its own heartbeat waits 10 s: this test beats by hand
    lost = recording(holder)
    other = boss(url)
    try:
        gone = await holder.acquire(kind="inference", allocations={0: 6_000})
        kept = await holder.acquire(kind="inference", allocations={1: 2_000})

        await asyncio.to_thread(redis_server.restart)
        taken = await other.acquire(kind="training", allocations={0: LIMIT_MB},
                                    heartbeat=False)
        await holder.beat()

        [(lease, reason)] = lost
        assert lease is gone and "taken" in reason
        assert not holder.holds(gone.id) and holder.holds(kept.id)
        leases = await stored_leases(url)
        assert leases == {taken.id: {0: LIMIT_MB}, kept.id: {1: 2_000}}
        assert within_limits(leases)
        await holder.beat()
        assert len(lost) == 1  # once per lost lease
    finally:
        await holder.close()
        await other.close()


async def test_redis_down_longer_than_the_ttl_loses_the_lease(redis_server: RedisServer):
    url = redis_server.url
    holder = boss(url)
    lost = recording(holder)
    try:
        held = await holder.acquire(kind="inference", allocations={0: 6_000})
        await asyncio.to_thread(redis_server.stop)
        await asyncio.sleep(TTL_S / 2)
        assert holder.holds(held.id) and lost == []  # a store error is not loss yet

        async def given_up() -> bool:
            return bool(lost)

        await eventually(given_up, within_s=3 * TTL_S)
        [(lease, reason)] = lost
        assert lease is held and "TTL" in reason and not holder.holds(held.id)
        await asyncio.to_thread(redis_server.start)
        await asyncio.sleep(2 * TTL_S / 3)
        assert await stored_leases(url) == {}  # given up: not re-asserted later
    finally:
        await holder.close()


async def test_config_update_while_redis_is_down_changes_nothing(redis_server: RedisServer):
    runtime = RuntimeConfig(RuntimeValues(), redis_url=redis_server.url)
    try:
        await runtime.restore()
        await runtime.update({"allowCloudFallback": False})
        await asyncio.to_thread(redis_server.stop)
        with pytest.raises(StoreUnavailable) as failed:
            await runtime.update({"allowCloudFallback": True})
        assert failed.value.status_code == 503 and "Retry-After" in failed.value.headers()
        assert runtime.allow_cloud_fallback is False
        await asyncio.to_thread(redis_server.start)
        await runtime.update({"allowCloudFallback": True})
        assert await stored_config(redis_server.url) == {"allowCloudFallback": True}
    finally:
        await runtime.close()


async def test_put_config_while_redis_is_down_is_a_503_and_keeps_the_value(
        tmp_path, redis_server: RedisServer):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], redis_url=redis_server.url)
    app = create_app(coordinator=coord)
    await coord.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as client:
            await asyncio.to_thread(redis_server.stop)
            put = await client.put("/api/v1/config", json={"allowCloudFallback": False})
            assert put.status_code == 503
            assert put.json()["error"]["code"] == "store_unavailable"
            assert int(put.headers["retry-after"]) >= 1
            assert (await client.get("/api/v1/config")).json() == {"allowCloudFallback": True}
            await asyncio.to_thread(redis_server.start)
    finally:
        await coord.runtime.close()
        await coord.stop()
