"""The spare diffusers worker on real processes: started ahead of the first cold load (imports
done, no model, no lease, in no slot), taken by that load, replaced in the background, refusing
work until it has a model, and gone with a SIGKILLed coordinator."""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

from tests.conftest import ServerProcess, pid_alive, wait_for, worker_secret

pytestmark = pytest.mark.slow

GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}], "spare_workers": True}
IMAGE = {"model": "sd-a", "prompt": "x", "size": "64x64", "x_steps": 1, "x_seed": 1}


def ready_spare(server: ServerProcess, not_pid: int | None = None) -> dict:
    spares = server.status()["spare_workers"]
    return next((s for s in spares if s.get("ready") and s["pid"] != not_pid), None)


def leases(server: ServerProcess) -> list[dict]:
    return httpx.get(server.url + "/api/v1/leases", timeout=10).json()["leases"]


def test_spare_is_taken_by_a_cold_load_replaced_and_dies_with_the_coordinator(tmp_path,
                                                                           tiny_sd):
    pipe = tiny_sd
    manifest = {"id": "sd-a", "category": "diffusion", "backend": "diffusers",
                "path": str(pipe), "vram_mb": 3000}
    server = ServerProcess(tmp_path / "server", GPU, [manifest]).start()
    try:
        first = wait_for(lambda: ready_spare(server), timeout=90)
        assert first, f"no spare came up:\n{server.log()}"
        assert first["pid"] in server.worker_pids() and first["rss_mb"] > 0
        assert leases(server) == [] and all(s["pid"] is None for s in server.status()["slots"])

        # it refuses work until it has a model, and refuses flags that are not a model's
        secret = worker_secret(first["pid"])
        worker = httpx.Client(base_url=f"http://127.0.0.1:{first['port']}", timeout=10,
                              headers={"Authorization": f"Bearer {secret}"})
        health = worker.get("/health")
        assert health.status_code == 503 and health.json()["state"] == "spare"
        refused = worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        bad = worker.post("/load", json={"args": ["--model", str(pipe), "--port", "1"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "args"
        assert httpx.get(f"http://127.0.0.1:{first['port']}/health").status_code == 401
        assert worker.get("/health").json()["state"] == "spare"

        sent_at = time.time()
        reply = httpx.post(server.url + "/v1/images/generations", json=IMAGE, timeout=120)
        assert reply.status_code == 200, reply.text
        slot = server.status()["slots"][0]
        # the load ran in the spare: a process that existed before the request was sent
        assert slot["pid"] == first["pid"] and slot["state"] == "ready"
        assert psutil.Process(slot["pid"]).create_time() < sent_at
        loaded = worker.get("/health").json()  # the same process, now with the model's flags
        assert loaded["state"] == "ready" and loaded["model"] == str(pipe)
        assert [lease["note"] for lease in leases(server)] == ["sd-a"]
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
        assert any(e["type"] == "spare_taken" and e["pid"] == first["pid"] for e in events)

        # replaced in the background: a new spare process, in no slot, holding no lease
        second = wait_for(lambda: next((s for s in server.status()["spare_workers"]
                                        if s["pid"] not in (None, first["pid"])), None),
                          timeout=30)
        assert second, f"the spare was not replaced:\n{server.log()}"
        assert second["pid"] in server.worker_pids()
        assert len(leases(server)) == 1

        workers = server.worker_pids()
        assert {first["pid"], second["pid"]} <= workers
        server.stop(signal.SIGKILL)
        gone = wait_for(lambda: not any(pid_alive(p) for p in workers), timeout=15)
        assert gone, "a worker or the spare outlived the SIGKILLed coordinator"
    finally:
        server.stop()
