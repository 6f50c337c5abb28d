"""GPUBoss over the embedded store, the HTTP lease API, and GPUBoss over that API."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from model_boss.api.app import create_app
from model_boss.errors import LeaseNotFound, LeaseUnavailable, StoreUnavailable
from model_boss.gpu import EmbeddedLeaseStore, GPUBoss, GPUInfo, Lease
from model_boss.gpu.http_store import HttpLeaseStore

from .fakes import coordinator, manifest

GPUS = [GPUInfo(0, "a", 8_512, "declared"), GPUInfo(1, "b", 4_512, "declared")]


def embedded() -> GPUBoss:
    return GPUBoss(EmbeddedLeaseStore(), GPUS, margin_mb=512)


async def test_embedded_race_and_all_or_nothing():
    boss = embedded()
    results = await asyncio.gather(*[boss.acquire(kind="x", allocations={0: 3_000},
                                                  heartbeat=False) for _ in range(5)],
                                   return_exceptions=True)
    assert sum(not isinstance(r, Exception) for r in results) == 2
    with pytest.raises(LeaseUnavailable):
        await boss.acquire(kind="x", allocations={0: 1_000, 1: 5_000})
    assert {u.index: u.leased_mb for u in await boss.usage()} == {0: 6_000, 1: 0}
    free = {u.index: u.free_mb for u in await boss.usage()}
    assert free == {0: 2_000, 1: 4_000}


async def test_embedded_expiry_and_heartbeat():
    boss = embedded()
    lapsed = await boss.acquire(kind="x", vram_mb=100, gpu=0, ttl_s=0.3, heartbeat=False)
    kept = await boss.acquire(kind="y", vram_mb=100, gpu=0, ttl_s=0.3)
    await asyncio.sleep(0.8)
    assert [lease.id for lease in await boss.leases()] == [kept.id]
    assert lapsed.id not in {lease.id for lease in await boss.leases()}
    await boss.close()
    assert await boss.leases() == []


class FlakyStore(EmbeddedLeaseStore):
    """The embedded store whose renewals fail while ``down`` (Redis unreachable)."""

    down = False

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None:
        if self.down:
            raise StoreUnavailable("lease store: Redis at redis://x unreachable")
        return await super().renew(lease_id, ttl_s)


def recording(boss: GPUBoss) -> list[tuple[Lease, str]]:
    lost: list[tuple[Lease, str]] = []
    boss.on_lease_lost = lambda lease, reason: lost.append((lease, reason))
    return lost


async def test_heartbeat_reasserts_a_lease_the_store_lost():
    boss = GPUBoss(EmbeddedLeaseStore(), GPUS, margin_mb=512, ttl_s=0.6)  # beats every 0.2 s
    lost = recording(boss)
    held = await boss.acquire(kind="inference", allocations={0: 3_000, 1: 1_000}, priority=2)
    await boss.store.release(held.id)  # the store forgot it (Redis restarted empty)
    await asyncio.sleep(0.5)
    [back] = await boss.leases()
    assert (back.id, back.allocations, back.priority) == (held.id, {0: 3_000, 1: 1_000}, 2)
    assert boss.holds(held.id) and lost == []
    await boss.store.release(held.id)
    assert (await boss.renew(held.id)).id == held.id  # an explicit renew re-asserts too
    assert [lease.id for lease in await boss.leases()] == [held.id]
    await boss.close()
    assert not boss.holds(held.id) and await boss.leases() == []


async def test_lease_whose_vram_was_taken_is_lost_once():
    boss = GPUBoss(EmbeddedLeaseStore(), GPUS, margin_mb=512, ttl_s=30)  # no beat for 10 s
    other = GPUBoss(boss.store, GPUS, margin_mb=512)
    calls: list[tuple[Lease, str]] = []

    def on_lost(lease: Lease, reason: str) -> None:
        calls.append((lease, reason))
        raise RuntimeError("a broken callback does not stop the heartbeat")

    boss.on_lease_lost = on_lost
    gone = await boss.acquire(kind="inference", allocations={0: 6_000})
    kept = await boss.acquire(kind="inference", allocations={1: 1_000})
    await boss.store.release(gone.id)
    taken = await other.acquire(kind="training", allocations={0: 8_000}, heartbeat=False)
    await boss.beat()
    await boss.beat()
    assert [(lease.id, "taken" in reason) for lease, reason in calls] == [(gone.id, True)]
    assert calls[0][0] is gone
    assert not boss.holds(gone.id) and boss.holds(kept.id)
    assert {lease.id: lease.allocations for lease in await boss.leases()} == {
        taken.id: {0: 8_000}, kept.id: {1: 1_000}}
    with pytest.raises(LeaseNotFound):
        await boss.renew(gone.id)
    await boss.close()


async def test_store_errors_within_the_ttl_are_retried_not_loss():
    store = FlakyStore()
    boss = GPUBoss(store, GPUS, margin_mb=512, ttl_s=30)
    lost = recording(boss)
    held = await boss.acquire(kind="inference", vram_mb=1_000, gpu=0)
    store.down = True
    await boss.beat()
    await boss.beat()
    assert boss.holds(held.id) and lost == []
    store.down = False
    await boss.beat()
    assert boss.holds(held.id) and lost == []
    await boss.close()


async def test_lease_unrenewed_for_longer_than_its_ttl_is_lost():
    store = FlakyStore()
    boss = GPUBoss(store, GPUS, margin_mb=512, ttl_s=0.8)  # beats every ~0.27 s
    lost: list[tuple[Lease, str]] = []
    given_up = asyncio.Event()

    def on_lost(lease: Lease, reason: str) -> None:
        lost.append((lease, reason))
        given_up.set()

    boss.on_lease_lost = on_lost
    held = await boss.acquire(kind="inference", vram_mb=1_000, gpu=0)
    start = time.monotonic()
    store.down = True
    await asyncio.wait_for(given_up.wait(), 5)
    assert time.monotonic() - start > 0.7  # not before its TTL
    [(lease, reason)] = lost
    assert lease is held and "longer than its 0.8s TTL" in reason
    assert not boss.holds(held.id)
    await boss.close()


class SwallowingStore(EmbeddedLeaseStore):
    """Renewals that swallow a cancel, as redis-py sometimes does mid-command."""

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass
        return await super().renew(lease_id, ttl_s)


async def test_close_stops_a_heartbeat_whose_cancel_was_swallowed():
    boss = GPUBoss(SwallowingStore(), GPUS, margin_mb=512, ttl_s=0.6)  # beats every 0.2 s
    await boss.acquire(kind="inference", vram_mb=1_000, gpu=0)
    await asyncio.sleep(0.4)  # a renewal is in flight
    closing = asyncio.create_task(boss.close())
    done, _ = await asyncio.wait({closing}, timeout=3)
    assert closing in done, "close() hung on a heartbeat that ignored its cancel"
    assert await boss.leases() == []


async def test_vram_mb_goes_to_the_gpu_with_most_free():
    boss = embedded()
    first = await boss.acquire(kind="x", vram_mb=5_000, heartbeat=False)
    second = await boss.acquire(kind="x", vram_mb=3_000, heartbeat=False)
    assert first.gpus == [0] and second.gpus == [1]  # 3000 vs 4000 MB free
    third = await boss.acquire(kind="x", vram_mb=1_000, heartbeat=False)
    assert third.gpus == [0]  # 3000 vs 1000 MB free


@pytest.fixture
async def daemon(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)],
                           gpus=[{"index": 0, "vram_mb": 8_512},
                                 {"index": 1, "vram_mb": 4_512}])
    app = create_app(coordinator=coord)
    await coord.start()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client, coord, transport
    await coord.stop()


async def test_http_lease_api(daemon):
    client, coord, _ = daemon
    taken = await client.post("/api/v1/leases", json={"kind": "training", "vram_mb": 6_000,
                                                      "gpu": 0, "ttl_s": 60})
    assert taken.status_code == 201
    lease = taken.json()
    assert lease["allocations"] == {"0": 6_000} and lease["kind"] == "training"
    full = await client.post("/api/v1/leases", json={"vram_mb": 6_000, "gpu": 0})
    assert full.status_code == 503 and full.json()["error"]["code"] == "lease_unavailable"
    assert int(full.headers["retry-after"]) >= 1
    split = await client.post("/api/v1/leases", json={"allocations": {"0": 1_000,
                                                                      "1": 9_999}})
    assert split.status_code == 503
    listing = (await client.get("/api/v1/leases")).json()
    assert [item["id"] for item in listing["leases"]] == [lease["id"]]
    assert listing["gpus"][0]["leased_mb"] == 6_000
    renewed = await client.post(f"/api/v1/leases/{lease['id']}/renew", json={"ttl_s": 120})
    assert renewed.status_code == 200 and renewed.json()["ttl_s"] == 120
    bad = await client.post("/api/v1/leases", json={"vram_mb": -5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "vram_mb"
    unknown = await client.post("/api/v1/leases", json={"vram_mb": 5, "gpu": 7})
    assert unknown.status_code == 400
    assert (await client.delete(f"/api/v1/leases/{lease['id']}")).json()["released"]
    gone = await client.delete(f"/api/v1/leases/{lease['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "lease_not_found"
    assert (await client.post("/api/v1/leases/nope/renew")).status_code == 404


async def test_outside_lease_blocks_a_model_load(daemon):
    client, coord, _ = daemon
    await client.post("/api/v1/leases", json={"kind": "training", "vram_mb": 8_000, "gpu": 0})
    await client.post("/api/v1/leases", json={"kind": "training", "vram_mb": 3_500, "gpu": 1})
    coord.pool.learned.observe_load("a", 0.01)  # so the budget admits it and it must wait
    response = await client.post("/v1/chat/completions", json={
        "model": "a", "x_budget_s": 0.5, "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "budget_exceeded"
    assert coord.pool.slots["a"].state == "idle"


async def test_gpuboss_over_the_http_api(daemon):
    _, coord, transport = daemon
    outside = GPUBoss(HttpLeaseStore("http://127.0.0.1", transport=transport), [])
    async with outside.lease(vram_mb=2_000, kind="training", gpu=1, ttl_s=30) as lease:
        assert [g.index for g in outside.gpus] == [0, 1]
        inside = {item.id for item in await coord.boss.leases()}
        assert lease.id in inside
    assert await coord.boss.leases() == []
    with pytest.raises(LeaseUnavailable):
        await outside.acquire(kind="x", allocations={1: 99_999})
    await outside.close()


async def test_gpuboss_over_the_http_api_reasserts_and_loses(daemon):
    _, coord, transport = daemon
    outside = GPUBoss(HttpLeaseStore("http://127.0.0.1", transport=transport), [], ttl_s=30)
    lost = recording(outside)
    held = await outside.acquire(kind="training", allocations={0: 5_000}, priority=3)
    await coord.boss.store.release(held.id)  # the daemon's store lost it
    await outside.beat()
    [back] = await coord.boss.leases()
    assert (back.id, back.holder, back.allocations, back.priority, back.ttl_s) == (
        held.id, held.holder, {0: 5_000}, 3, 30)
    assert outside.holds(held.id) and lost == []
    await coord.boss.store.release(held.id)
    await coord.boss.acquire(kind="inference", allocations={0: 4_000}, heartbeat=False)
    await outside.beat()
    assert [lease.id for lease, _ in lost] == [held.id] and not outside.holds(held.id)
    await outside.close()


async def test_reassert_endpoint_validates(daemon):
    client, coord, _ = daemon
    body = {"kind": "training", "holder": "job", "allocations": {"0": 1_000}}
    put = await client.put("/api/v1/leases/lease-0123456789abcdef", json=body)
    assert put.status_code == 200 and put.json()["id"] == "lease-0123456789abcdef"
    again = await client.put("/api/v1/leases/lease-0123456789abcdef", json=body)
    assert again.status_code == 200  # idempotent: still one lease
    assert [lease.vram_mb for lease in await coord.boss.leases()] == [1_000]
    unknown = await client.put("/api/v1/leases/lease-x", json={**body, "allocations": {"7": 1}})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "gpu"
    empty = await client.put("/api/v1/leases/lease-x", json={**body, "allocations": {}})
    assert empty.status_code == 400
    full = await client.put("/api/v1/leases/lease-y", json={**body, "allocations": {"0": 9_000}})
    assert full.status_code == 503 and full.json()["error"]["code"] == "lease_unavailable"
    assert "retry-after" in full.headers
    bad_id = await client.put("/api/v1/leases/%20x", json=body)
    assert bad_id.status_code == 400, bad_id.text  # never FastAPI's 422
    assert bad_id.json()["error"]["type"] == "invalid_request_error", bad_id.text
