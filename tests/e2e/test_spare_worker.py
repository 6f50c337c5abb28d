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


def test_a_transformers_spare_takes_an_embedder_then_a_voice(tmp_path, tmp_path_factory):
    """The transformers worker's spare: up before any request (torch, transformers and
    sentence-transformers imported), refusing work until it has a model, taken by the
    embedder's cold load, replaced, and the replacement taken by the voice's."""
    pytest.importorskip("sentence_transformers", reason="the 'transformers' extra")
    from tests.transformers_fixtures import build_embedder, build_voice, shared

    manifests = [
        {"id": "embed", "backend": "transformers", "category": "embedding",
         "path": str(shared(tmp_path_factory, "embedder", build_embedder)), "vram_mb": 1000},
        {"id": "voice", "backend": "transformers", "category": "tts",
         "path": str(shared(tmp_path_factory, "voice", build_voice)), "vram_mb": 1000}]
    server = ServerProcess(tmp_path / "server", GPU, manifests).start()
    try:
        first = wait_for(lambda: ready_spare(server), timeout=90)
        assert first, f"no spare came up:\n{server.log()}"
        assert first["kind"] == "transformers" and leases(server) == []
        worker = httpx.Client(base_url=f"http://127.0.0.1:{first['port']}", timeout=10,
                              headers={"Authorization": f"Bearer {worker_secret(first['pid'])}"})
        assert worker.get("/health").json()["state"] == "spare"
        refused = worker.post("/v1/embeddings", json={"input": "a cat"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        bad = worker.post("/load", json={"args": ["--model", "x", "--task", "embedding",
                                                  "--spare"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "args"

        sent_at = time.time()
        reply = httpx.post(server.url + "/v1/embeddings", timeout=120,
                           json={"model": "embed", "input": "the cat sat"})
        assert reply.status_code == 200, reply.text
        embed = next(s for s in server.status()["slots"] if s["model"] == "embed")
        assert embed["pid"] == first["pid"] and embed["state"] == "ready"
        assert psutil.Process(embed["pid"]).create_time() < sent_at
        assert worker.get("/health").json()["task"] == "embedding"

        second = wait_for(lambda: ready_spare(server, not_pid=first["pid"]), timeout=90)
        assert second, f"the spare was not replaced:\n{server.log()}"
        sent_at = time.time()
        spoken = httpx.post(server.url + "/v1/audio/speech", timeout=120, json={
            "model": "voice", "input": "hello", "response_format": "wav"})
        assert spoken.status_code == 200 and spoken.content[:4] == b"RIFF"
        voice = next(s for s in server.status()["slots"] if s["model"] == "voice")
        assert voice["pid"] == second["pid"]
        assert psutil.Process(voice["pid"]).create_time() < sent_at
        assert sorted(lease["note"] for lease in leases(server)) == ["embed", "voice"]
    finally:
        server.stop()
