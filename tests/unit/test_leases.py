"""GPUBoss over the embedded store, the HTTP lease API, and GPUBoss over that API."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from model_boss.api.app import create_app
from model_boss.errors import LeaseUnavailable
from model_boss.gpu import EmbeddedLeaseStore, GPUBoss, GPUInfo
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
    async with httpx.AsyncClient(transport=transport, base_url="http://mb") as client:
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
    outside = GPUBoss(HttpLeaseStore("http://mb", transport=transport), [])
    async with outside.lease(vram_mb=2_000, kind="training", gpu=1, ttl_s=30) as lease:
        assert [g.index for g in outside.gpus] == [0, 1]
        inside = {item.id for item in await coord.boss.leases()}
        assert lease.id in inside
    assert await coord.boss.leases() == []
    with pytest.raises(LeaseUnavailable):
        await outside.acquire(kind="x", allocations={1: 99_999})
    await outside.close()
