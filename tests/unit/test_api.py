"""The HTTP surface in-process (httpx.ASGITransport) over in-process backends."""

from __future__ import annotations

import httpx
import pytest
import yaml

from model_boss.api.app import create_app

from .fakes import coordinator, manifest


@pytest.fixture
async def api(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("a", 1000, aliases=["alias-a"]),
                                        manifest("b", 1000)],
                             api_key="user-key", admin_api_key="admin-key")
    app = create_app(coordinator=coord)
    await coord.start()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://mb") as client:
        yield client, coord
    await coord.stop()


USER = {"authorization": "Bearer user-key"}
ADMIN = {"authorization": "Bearer admin-key"}
CHAT = {"model": "alias-a", "messages": [{"role": "user", "content": "hi"}]}


async def test_keys_are_required_where_configured(api):
    client, _ = api
    denied = await client.post("/v1/chat/completions", json=CHAT)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    wrong = await client.post("/v1/chat/completions", json=CHAT,
                              headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = await client.post("/v1/chat/completions", json=CHAT, headers=USER)
    assert ok.status_code == 200 and ok.headers["x-model-boss-model"] == "a"
    assert (await client.get("/api/v1/status", headers=USER)).status_code == 401
    assert (await client.get("/api/v1/status", headers=ADMIN)).status_code == 200
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200


async def test_unknown_route_and_method_use_the_envelope(api):
    client, _ = api
    missing = await client.get("/v1/nothing-here", headers=USER)
    assert missing.status_code == 404 and set(missing.json()["error"]) == {
        "message", "type", "param", "code"}
    wrong = await client.get("/v1/chat/completions", headers=USER)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


async def test_admin_load_pin_unload(api):
    client, coord = api
    loaded = await client.post("/api/v1/models/b/load", headers=ADMIN)
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready"
    pinned = await client.post("/api/v1/models/b/pin", headers=ADMIN)
    assert pinned.json()["pinned"] is True and pinned.json()["unload_at"] is None
    assert (await client.post("/api/v1/models/b/unload", headers=ADMIN)).json()["unloaded"]
    assert coord.pool.slots["b"].state == "idle"
    assert (await client.post("/api/v1/models/zzz/load", headers=ADMIN)).status_code == 404


async def test_config_and_events_and_metrics(api):
    client, _ = api
    assert (await client.get("/api/v1/config", headers=ADMIN)).json() == {
        "allowCloudFallback": True}
    put = await client.put("/api/v1/config", headers=ADMIN, json={"allowCloudFallback": False})
    assert put.json() == {"allowCloudFallback": False}
    assert (await client.put("/api/v1/config", headers=ADMIN, content=b"{x")).status_code == 400
    await client.post("/v1/chat/completions", json=CHAT, headers=USER)
    events = (await client.get("/api/v1/events?stream=false", headers=ADMIN)).json()["events"]
    kinds = [e["type"] for e in events]
    assert "config_changed" in kinds and "loaded" in kinds
    since = events[-1]["seq"]
    later = (await client.get(f"/api/v1/events?stream=false&since={since}",
                              headers=ADMIN)).json()["events"]
    assert later == []
    metrics = (await client.get("/metrics")).text
    assert 'model_boss_loads_total{model="a"} 1.0' in metrics
    assert 'model_boss_requests_total{endpoint="/v1/chat/completions",model="a",' \
           'status="200"} 1.0' in metrics
    assert 'model_boss_gpu_leased_mb{gpu="0"} 1000.0' in metrics


async def test_models_listing(api):
    client, _ = api
    data = (await client.get("/v1/models", headers=USER)).json()["data"]
    assert [m["id"] for m in data] == ["a", "b"]
    assert data[0]["aliases"] == ["alias-a"] and data[0]["available"] is True


def test_create_app_reads_the_config_file_named_by_the_environment(tmp_path, monkeypatch):
    (tmp_path / "m.yaml").write_text(yaml.safe_dump([{"id": "from-file", "path": "w.gguf",
                                                       "vram_mb": 100}]))
    config = tmp_path / "model-boss.yaml"
    config.write_text(yaml.safe_dump({
        "port": 8299, "manifests": ["m.yaml"], "tasks_file": None, "use_nvml": False,
        "state_dir": "state", "gpus": [{"index": 0, "vram_mb": 1024}]}))
    monkeypatch.setenv("MODEL_BOSS_CONFIG", str(config))
    coord = create_app().state.coordinator
    assert coord.settings.port == 8299 and "from-file" in coord.catalog
    assert coord.settings.state_dir == tmp_path / "state"
