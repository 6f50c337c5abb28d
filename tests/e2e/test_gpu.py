"""CUDA paths: real VRAM figures, offload to CPU RAM and back; a transformers model's VRAM
measured on the GPU, learned, and kept across a restart. Skipped without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, wait_for, worker_health
from tests.diffusion_fixtures import build_tiny_sd_pipeline
from tests.transformers_fixtures import build_embedder

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def cuda_worker(tmp_path_factory):
    path = build_tiny_sd_pipeline(tmp_path_factory.mktemp("gpu") / "sd", width=256)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "workers.diffusers", "--model",
                             str(path), "--port", str(port), "--device", "cuda"])
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout=300)
    yield url
    proc.terminate()
    proc.wait(30)


def test_measured_vram_offload_and_onload(cuda_worker):
    """The onload beats the cold load: both as the worker timed them (the cold load's
    ``load_s`` leaves out the interpreter's start and the imports)."""
    url = cuda_worker
    health = httpx.get(url + "/health").json()
    assert health["device"] == "cuda" and health["tier"] == "gpu"
    allocated = health["memory"]["cuda_allocated_mb"]
    assert allocated >= health["footprint_mb"] * 0.9
    offload = httpx.post(url + "/offload", timeout=120).json()
    assert offload["tier"] == "cpu" and offload["freed_mb"] >= allocated * 0.9
    after = httpx.get(url + "/health").json()["memory"]["cuda_allocated_mb"]
    assert after <= allocated * 0.1
    onload = httpx.post(url + "/onload", timeout=120).json()
    assert onload["tier"] == "gpu" and onload["seconds"] < health["load_s"], (onload, health)
    assert httpx.get(url + "/health").json()["memory"]["cuda_allocated_mb"] >= allocated * 0.9
    image = httpx.post(url + "/generate", timeout=120, json={
        "prompt": "x", "width": 64, "height": 64, "steps": 2}).json()
    assert image["memory_decisions"]["vae"] in ("gpu", "tiled")


def test_nvml_inventory():
    from model_boss.gpu import open_nvml

    nvml = open_nvml()
    assert nvml is not None
    gpus = nvml.gpus()
    assert gpus and all(g.vram_mb > 1000 and g.source == "nvml" for g in gpus)
    assert 0 < nvml.free_mb(0) <= gpus[0].vram_mb


def test_a_transformers_models_vram_is_measured_learned_and_kept(tmp_path):
    """An embedder on the real GPU (NVML inventory, nothing declared): the worker reports
    CUDA's own figures, the coordinator learns them as the model's VRAM (a ``measured`` event
    with ``vram``), saves them in learned.json, and after a restart estimates the model by
    them when it is loaded again."""
    pytest.importorskip("sentence_transformers", reason="the 'transformers' extra")
    embedder = build_embedder(tmp_path / "embedder", hidden=256, layers=4)
    manifest = {"id": "embed", "backend": "transformers", "category": "embedding",
                "path": str(embedder), "vram_mb": 1000}
    server = ServerProcess(tmp_path / "server", {"use_nvml": True}, [manifest])

    def embed_slot() -> dict:
        return next(s for s in server.status()["slots"] if s["model"] == "embed")

    def measured() -> list[dict]:
        listed = httpx.get(server.url + "/api/v1/events?stream=false", timeout=10).json()
        return [e for e in listed["events"] if e["type"] == "measured" and e["model"] == "embed"]

    server.start()
    try:
        answer = httpx.post(server.url + "/v1/embeddings", timeout=300,
                            json={"model": "embed", "input": "the cat sat on the mat"})
        assert answer.status_code == 200, answer.text
        health = worker_health(embed_slot())
        assert health["device"] == "cuda" and health["tier"] == "gpu", health
        assert health["memory"]["cuda_allocated_mb"] >= 1, health
        event = wait_for(measured, timeout=30)[-1]
        assert event["vram"] is True and event["mb"] >= 1, event
        assert embed_slot()["measured_mb"] == event["mb"]
    finally:
        server.stop()
    learned = json.loads((tmp_path / "server" / "state" / "learned.json").read_text())
    assert learned["models"]["embed"]["vram_mb"] == event["mb"], learned
    server.start()  # the learned figure survives the restart: the next load is leased by it
    try:
        httpx.post(server.url + "/api/v1/models/embed/load", timeout=300).raise_for_status()
        estimate = embed_slot()["vram_estimate"]
        assert estimate["rung"] == "measured" and estimate["mb"] == event["mb"], estimate
    finally:
        server.stop()


def test_a_transformers_worker_parks_in_cpu_ram_and_comes_back(tmp_path):
    """The CPU tier on CUDA for a transformers worker: ``/offload`` hands its VRAM back to the
    device (CUDA's allocated figure falls to almost nothing), ``/onload`` brings the weights
    back faster than the cold load took, and the model answers on the GPU again."""
    pytest.importorskip("sentence_transformers", reason="the 'transformers' extra")
    embedder = build_embedder(tmp_path / "embedder", hidden=512, layers=8)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "workers.transformers", "--model",
                             str(embedder), "--task", "embedding", "--port", str(port),
                             "--device", "cuda"])
    url = f"http://127.0.0.1:{port}"

    def ready() -> dict | None:
        try:
            health = httpx.get(url + "/health", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None
        return health if health.get("state") == "ready" else None

    try:
        health = wait_for(ready, timeout=300)
        assert health["device"] == "cuda" and health["tier"] == "gpu", health
        allocated = health["memory"]["cuda_allocated_mb"]
        assert allocated >= health["footprint_mb"] * 0.9, health
        offload = httpx.post(url + "/offload", timeout=120).json()
        assert offload["state"] == "offloaded", offload
        parked = httpx.get(url + "/health", timeout=10).json()
        assert parked["tier"] == "cpu" and parked["memory"]["cuda_allocated_mb"] <= 1, parked
        onload = httpx.post(url + "/onload", timeout=120).json()
        assert onload["state"] == "ready" and onload["seconds"] < health["load_s"], onload
        back = httpx.get(url + "/health", timeout=10).json()
        assert back["memory"]["cuda_allocated_mb"] >= allocated * 0.9, back
        answer = httpx.post(url + "/v1/embeddings", timeout=60,
                            json={"model": "embed", "input": ["the cat sat", "on the mat"]})
        assert answer.status_code == 200, answer.text
        assert [len(item["embedding"]) for item in answer.json()["data"]] == [512, 512]
    finally:
        proc.terminate()
        proc.wait(30)
