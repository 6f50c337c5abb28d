"""The HTTP lease API (api/leases.py) in-process, and HttpLeaseStore end to end against it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from model_boss.api.errors import install_error_handlers
from model_boss.api.leases import router
from model_boss.errors import (
    BadRequest,
    LeaseUnavailable,
    StoreUnavailable,
    Unauthorized,
)
from model_boss.gpu import EmbeddedLeaseStore, GPUBoss, GPUInfo, Lease
from model_boss.gpu.http_store import HttpLeaseStore
from model_boss.gpu.redis_store import RedisLeaseStore

GPUS = [GPUInfo(0, "sim-a", 8_512, "declared"), GPUInfo(1, "sim-b", 4_512, "declared")]


def lease_app(boss: GPUBoss, api_key: str | None = None) -> FastAPI:
    """The lease router alone, with the error handlers the real app installs (a body that
    fails validation is the app's 400, not FastAPI's own 422)."""
    app = FastAPI()
    app.include_router(router)
    app.state.boss = boss
    install_error_handlers(app)

    if api_key is not None:
        @app.middleware("http")
        async def _key(request: Request, call_next):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse(Unauthorized("missing or invalid API key").envelope(),
                                    status_code=401)
            return await call_next(request)

    return app


@pytest.fixture
async def daemon() -> AsyncIterator[tuple[httpx.AsyncClient, GPUBoss, httpx.ASGITransport]]:
    boss = GPUBoss(EmbeddedLeaseStore(), GPUS, margin_mb=512, ttl_s=30)
    transport = httpx.ASGITransport(app=lease_app(boss))
    async with httpx.AsyncClient(transport=transport, base_url="http://mb") as client:
        yield client, boss, transport
    await boss.close()


async def leased(boss: GPUBoss) -> dict[int, int]:
    return {u.index: u.leased_mb for u in await boss.usage()}


async def test_grant_list_and_gpus(daemon):
    client, boss, _ = daemon
    taken = await client.post("/api/v1/leases", json={"kind": "training", "vram_mb": 6_000,
                                                      "gpu": 0, "ttl_s": 60, "note": "run 7"})
    assert taken.status_code == 201
    lease = taken.json()
    assert lease["allocations"] == {"0": 6_000} and lease["vram_mb"] == 6_000
    assert lease["kind"] == "training" and lease["note"] == "run 7" and lease["ttl_s"] == 60
    assert lease["holder"].startswith("http:")  # none given: named after the caller
    assert [held.id for held in await boss.leases()] == [lease["id"]]

    listing = (await client.get("/api/v1/leases")).json()
    assert [item["id"] for item in listing["leases"]] == [lease["id"]]
    assert [(g["index"], g["leased_mb"], g["free_mb"]) for g in listing["gpus"]] == [
        (0, 6_000, 2_000), (1, 0, 4_000)]

    gpus = (await client.get("/api/v1/gpus")).json()["gpus"]
    assert [(g["index"], g["name"], g["vram_mb"], g["source"], g["leased_mb"]) for g in gpus] \
        == [(0, "sim-a", 8_512, "declared", 6_000), (1, "sim-b", 4_512, "declared", 0)]


async def test_vram_mb_without_gpu_goes_to_the_most_free_gpu(daemon):
    client, _, _ = daemon
    first = (await client.post("/api/v1/leases", json={"vram_mb": 5_000})).json()
    second = (await client.post("/api/v1/leases", json={"vram_mb": 1_000})).json()
    assert first["allocations"] == {"0": 5_000} and first["kind"] == "external"
    assert second["allocations"] == {"1": 1_000}  # 4000 free on GPU 1 vs 3000 on GPU 0


async def test_no_room_is_503_with_retry_after_and_takes_nothing(daemon):
    client, boss, _ = daemon
    await client.post("/api/v1/leases", json={"allocations": {"1": 3_500}})
    full = await client.post("/api/v1/leases", json={"allocations": {"0": 1_000, "1": 600}})
    assert full.status_code == 503
    assert full.json()["error"]["code"] == "lease_unavailable"
    assert int(full.headers["retry-after"]) >= 1
    assert await leased(boss) == {0: 0, 1: 3_500}  # GPU 0 untouched: all or nothing


async def test_invalid_bodies_are_refused(daemon):
    client, boss, _ = daemon
    for body in ({"vram_mb": -5}, {"vram_mb": 10, "ttl_s": 3_601}, {"vram_mb": 10, "ttl_s": 0},
                 {"allocations": {"0": 0}}, {"allocations": {"-1": 10}}, {"allocations": {}},
                 {"vram_mb": 10, "allocations": {"0": 10}}, {"vram_mb": 10, "bogus": 1}):
        response = await client.post("/api/v1/leases", json=body)
        assert response.status_code == 400, body
        assert response.json()["error"]["type"] == "invalid_request_error", response.text
    unknown = await client.post("/api/v1/leases", json={"vram_mb": 5, "gpu": 7})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "gpu"
    missing = await client.post("/api/v1/leases", json={"kind": "training"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "vram_mb"
    assert await boss.leases() == []


async def test_http_leases_are_renewed_by_their_holder_not_the_daemon(daemon):
    client, boss, _ = daemon
    idle = (await client.post("/api/v1/leases", json={"vram_mb": 100, "ttl_s": 0.4})).json()
    kept = (await client.post("/api/v1/leases", json={"vram_mb": 100, "ttl_s": 0.4})).json()
    renewed = await client.post(f"/api/v1/leases/{kept['id']}/renew", json={"ttl_s": 30})
    assert renewed.status_code == 200 and renewed.json()["ttl_s"] == 30
    assert renewed.json()["expires_at"] > kept["expires_at"] + 25
    await asyncio.sleep(0.8)  # well past 0.4 s: the daemon must not have kept `idle` alive
    assert [held.id for held in await boss.leases()] == [kept["id"]]
    gone = await client.post(f"/api/v1/leases/{idle['id']}/renew", json={"ttl_s": 30})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "lease_not_found"
    default = await client.post(f"/api/v1/leases/{kept['id']}/renew")  # no body
    assert default.status_code == 200 and default.json()["ttl_s"] == boss.ttl_s


async def test_release(daemon):
    client, boss, _ = daemon
    lease = (await client.post("/api/v1/leases", json={"vram_mb": 8_000, "gpu": 0})).json()
    released = await client.delete(f"/api/v1/leases/{lease['id']}")
    assert released.status_code == 200
    assert released.json() == {"id": lease["id"], "released": True}
    assert await leased(boss) == {0: 0, 1: 0}
    again = await client.delete(f"/api/v1/leases/{lease['id']}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "lease_not_found"
    retaken = await client.post("/api/v1/leases", json={"vram_mb": 8_000, "gpu": 0})
    assert retaken.status_code == 201


# -- HttpLeaseStore: GPUBoss in an outside process, talking to the daemon's API -----------


async def test_gpuboss_over_http_store(daemon):
    _, inside, transport = daemon
    outside = GPUBoss(HttpLeaseStore("http://mb", transport=transport), [], ttl_s=0.6,
                      holder="trainer@host:1")
    try:
        async with outside.lease(vram_mb=3_000, kind="training", gpu=1) as lease:
            assert [(g.index, g.name, g.vram_mb) for g in outside.gpus] == [
                (0, "sim-a", 8_512), (1, "sim-b", 4_512)]  # inventory read from the API
            [held] = await inside.leases()
            assert held.id == lease.id and held.holder == "trainer@host:1"
            granted_until = held.expires_at
            assert lease.expires_at == pytest.approx(granted_until)
            await asyncio.sleep(1.5)  # > 2 TTLs: only the outside heartbeat keeps it alive
            [still] = await inside.leases()
            assert still.id == lease.id and still.expires_at > granted_until + 0.5
            assert await leased(inside) == {0: 0, 1: 3_000}
        assert await inside.leases() == []
        with pytest.raises(LeaseUnavailable):
            await outside.acquire(kind="x", allocations={0: 5_000, 1: 4_001})
        assert await leased(inside) == {0: 0, 1: 0}
    finally:
        await outside.close()


async def test_http_store_protocol(daemon):
    _, inside, transport = daemon
    store = HttpLeaseStore("http://mb/", transport=transport)
    try:
        taken = await inside.acquire(kind="x", vram_mb=7_000, gpu=0, heartbeat=False)
        mine = Lease(id="client-side", holder="me", kind="y", allocations={0: 1_500}, ttl_s=9)
        assert not await store.acquire(mine, {})  # 503 lease_unavailable: False, no raise
        assert mine.id == "client-side"
        mine.allocations = {0: 1_000}
        assert await store.acquire(mine, {})
        assert mine.id != "client-side" and mine.expires_at > 0  # the daemon's id and clock
        assert {held.id for held in await store.list()} == {taken.id, mine.id}
        renewed = await store.renew(mine.id, 20)
        assert renewed is not None and renewed.ttl_s == 20
        assert await store.release(mine.id)
        assert not await store.release(mine.id)
        assert await store.renew(mine.id, 20) is None
        await store.publish_inventory([])  # the daemon's inventory is not replaced
        assert [g["index"] for g in await store.inventory()] == [0, 1]
        with pytest.raises(BadRequest, match="unknown GPU"):
            await store.acquire(Lease(id="z", holder="me", kind="y", allocations={9: 1}), {})
    finally:
        await store.close()


async def test_http_store_sends_the_api_key():
    boss = GPUBoss(EmbeddedLeaseStore(), GPUS)
    transport = httpx.ASGITransport(app=lease_app(boss, api_key="s3cret"))
    good = HttpLeaseStore("http://mb", api_key="s3cret", transport=transport)
    bad = HttpLeaseStore("http://mb", api_key="wrong", transport=transport)
    try:
        assert [g["index"] for g in await good.inventory()] == [0, 1]
        with pytest.raises(Unauthorized) as refused:
            await bad.list()
        assert refused.value.status_code == 401
    finally:
        await good.close()
        await bad.close()


async def test_http_store_errors_are_model_boss_errors():
    unreachable = HttpLeaseStore("http://127.0.0.1:1", timeout_s=5)
    with pytest.raises(StoreUnavailable, match="unreachable"):
        await unreachable.list()
    await unreachable.close()

    # The daemon's own store is down: renew must raise (a heartbeat retries), not say "gone".
    dead = GPUBoss(RedisLeaseStore("redis://127.0.0.1:1/0", timeout_s=2), GPUS)
    store = HttpLeaseStore("http://mb", transport=httpx.ASGITransport(app=lease_app(dead)))
    try:
        with pytest.raises(StoreUnavailable) as down:
            await store.renew("lease-x", 10)
        assert down.value.status_code == 503 and down.value.retry_after_s == 5
        with pytest.raises(StoreUnavailable):
            await store.acquire(Lease(id="z", holder="me", kind="y", allocations={0: 1}), {})
    finally:
        await store.close()
        await dead.close()

