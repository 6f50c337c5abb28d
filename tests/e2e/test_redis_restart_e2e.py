"""A coordinator with a model loaded while its Redis restarts empty (no persistence).

Leases come back under the same ids, the slot keeps serving on its own lease, the runtime
config and the GPU inventory are back in Redis; when another holder takes the VRAM first, the
slot leaves READY and its worker stops before anything is served from that VRAM again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import pytest
import redis

from model_boss.gpu import GPUBoss
from tests.conftest import ServerProcess, llama_manifest, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

CHAT = {"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def server_on(tmp_path, demo_gguf, redis_server):
    def make(**extra) -> ServerProcess:
        config = {"redis_url": redis_server.url, "lease_ttl_s": 3,
                  "gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}], **extra}
        return ServerProcess(tmp_path, config, [llama_manifest("smol", demo_gguf,
                                                               vram_mb=3000)]).start()
    return make


def test_leases_config_and_inventory_survive(server_on, redis_server):
    server = server_on()
    try:
        assert httpx.post(server.url + "/v1/chat/completions", json=CHAT,
                          timeout=60).status_code == 200
        assert httpx.put(server.url + "/api/v1/config",
                         json={"allowCloudFallback": False}).status_code == 200
        before = server.status()["slots"][0]["lease"]["id"]
        redis_server.restart()

        def reasserted() -> bool:
            status = server.status()
            return [lease["id"] for lease in status["leases"]] == [before]

        wait_for(reasserted, timeout=10)
        slot = server.status()["slots"][0]
        assert slot["state"] == "ready" and slot["lease"]["id"] == before
        assert httpx.post(server.url + "/v1/chat/completions", json=CHAT,
                          timeout=60).status_code == 200

        async def inventory() -> list:
            boss = GPUBoss.from_url(redis_server.url)  # no gpus given: the published ones
            try:
                return [g.capacity_mb for g in (await boss.usage())]
            finally:
                await boss.close()

        wait_for(lambda: asyncio.run(inventory()) == [4096], timeout=10)
        assert httpx.get(server.url + "/api/v1/config").json() == {"allowCloudFallback": False}
        client = redis.Redis.from_url(redis_server.url)
        try:
            wait_for(lambda: any(b"allowCloudFallback" in (client.get(k) or b"")
                                 for k in client.scan_iter("*config*")
                                 if client.type(k) == b"string"), timeout=10)
        finally:
            client.close()
    finally:
        server.stop()


def test_vram_taken_during_the_restart_stops_the_slot(server_on, redis_server):
    server = server_on()
    try:
        assert httpx.post(server.url + "/v1/chat/completions", json=CHAT,
                          timeout=60).status_code == 200
        pid = server.status()["slots"][0]["pid"]

        async def take_the_gpu() -> str:
            outside = GPUBoss.from_url(redis_server.url, gpus=_gpus())
            lease = await outside.acquire(kind="training", vram_mb=3500, heartbeat=False,
                                          ttl_s=120)
            await outside.close(release_held=False)
            return lease.id

        # the outside holder comes first: the coordinator is paused while Redis restarts and
        # the GPU is taken (its heartbeat, every second here, would otherwise re-assert its
        # lease first in some runs on a busy box), then goes on and finds its lease gone
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            redis_server.restart()
            training = asyncio.run(take_the_gpu())
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)

        def stopped() -> bool:
            slot = server.status()["slots"][0]
            return slot["state"] == "idle" and slot["lease"] is None

        wait_for(stopped, timeout=15)
        status = server.status()
        assert [lease["id"] for lease in status["leases"]] == [training]
        assert pid not in server.worker_pids()
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
        assert any(e["type"] == "lease_lost" for e in events), json.dumps(events[-5:])
        refused = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                             json={**CHAT, "x_budget_s": 2})
        assert refused.status_code == 503  # no room while the training job holds the GPU
    finally:
        server.stop()


def _gpus():
    from model_boss.gpu.inventory import GPUInfo

    return [GPUInfo(0, "sim-4g", 4096, "declared")]
