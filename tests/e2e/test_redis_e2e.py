"""A coordinator on a real Redis: shared leases with an outside job, persisted config."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from model_boss.gpu import GPUBoss
from tests.conftest import ServerProcess, llama_manifest

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_outside_training_lease_and_config_persistence(tmp_path, demo_gguf, redis_url):
    redis_db = redis_url.rsplit("/", 1)[0] + "/3"  # a database of its own
    config = {"redis_url": redis_db, "lease_ttl_s": 5,
              "gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}]}
    manifests = [llama_manifest("smol", demo_gguf, vram_mb=3000)]
    server = ServerProcess(tmp_path, config, manifests).start()
    try:
        assert server.status()["lease_store"] == "redis"

        async def training_then_chat():
            outside = GPUBoss.from_url(redis_db)  # inventory comes from the daemon
            async with outside.lease(vram_mb=2000, kind="training") as lease:
                async with httpx.AsyncClient(timeout=60) as client:
                    listed = (await client.get(server.url + "/api/v1/leases")).json()
                    assert [item["id"] for item in listed["leases"]] == [lease.id]
                    blocked = await client.post(server.url + "/v1/chat/completions", json={
                        "model": "smol", "x_budget_s": 4,
                        "messages": [{"role": "user", "content": "hi"}]})
            await outside.close()
            return blocked

        blocked = asyncio.run(training_then_chat())
        assert blocked.status_code == 503
        assert blocked.json()["error"]["code"] == "budget_exceeded"
        ok = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200
        assert httpx.put(server.url + "/api/v1/config",
                         json={"allowCloudFallback": False}).status_code == 200
    finally:
        server.stop()
    again = ServerProcess(tmp_path, {**config, "state_dir": str(tmp_path / "other-state")},
                          manifests)
    again.config_path = tmp_path / "again.yaml"
    import yaml

    settings = yaml.safe_load(server.config_path.read_text())
    settings["state_dir"] = str(tmp_path / "other-state")
    settings["port"] = again.port
    again.config_path.write_text(yaml.safe_dump(settings))
    again.start()
    try:
        assert httpx.get(again.url + "/api/v1/config").json() == {"allowCloudFallback": False}
        assert again.status()["leases"] == []  # the first run released its leases
    finally:
        again.stop()


def test_sigkilled_coordinator_leaves_no_lease_or_worker(tmp_path, demo_gguf, redis_url):
    """SIGKILL with a model loaded, leases in Redis with a long TTL; the next coordinator on
    this host reaps the workers and releases the dead one's leases at once, not after the TTL."""
    import signal

    from tests.conftest import pid_alive

    redis_db = redis_url.rsplit("/", 1)[0] + "/4"
    config = {"redis_url": redis_db, "lease_ttl_s": 300,
              "gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}]}
    manifests = [llama_manifest("smol", demo_gguf, vram_mb=3000)]
    first = ServerProcess(tmp_path, config, manifests).start()
    try:
        assert httpx.post(first.url + "/v1/chat/completions", timeout=60, json={
            "model": "smol", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        workers = first.worker_pids()
        assert workers and len(first.status()["leases"]) == 1
        first.stop(signal.SIGKILL)
        second = ServerProcess(tmp_path, config, manifests).start()  # same state_dir
        try:
            status = second.status()
            assert status["leases"] == [] and status["gpus"][0]["leased_mb"] == 0
            assert not [pid for pid in workers if pid_alive(pid)]
            events = httpx.get(second.url + "/api/v1/events?stream=false").json()["events"]
            assert any(e["type"] == "leases_reclaimed" for e in events)
        finally:
            second.stop()
    finally:
        first.stop()
