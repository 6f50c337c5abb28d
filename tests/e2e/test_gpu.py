"""CUDA paths: real VRAM figures, offload to CPU RAM and back. Skipped without a GPU."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import free_port, wait_for
from tests.diffusion_fixtures import build_tiny_sd_pipeline

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def cuda_worker(tmp_path_factory):
    path = build_tiny_sd_pipeline(tmp_path_factory.mktemp("gpu") / "sd", width=256)
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "workers.diffusers", "--model",
                             str(path), "--port", str(port), "--device", "cuda"])
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout=300)
    yield url, time.monotonic() - started
    proc.terminate()
    proc.wait(30)


def test_measured_vram_offload_and_onload(cuda_worker):
    url, cold_s = cuda_worker
    health = httpx.get(url + "/health").json()
    assert health["device"] == "cuda" and health["tier"] == "gpu"
    allocated = health["memory"]["cuda_allocated_mb"]
    assert allocated >= health["footprint_mb"] * 0.9
    offload = httpx.post(url + "/offload", timeout=120).json()
    assert offload["tier"] == "cpu" and offload["freed_mb"] >= allocated * 0.9
    after = httpx.get(url + "/health").json()["memory"]["cuda_allocated_mb"]
    assert after <= allocated * 0.1
    onload = httpx.post(url + "/onload", timeout=120).json()
    assert onload["tier"] == "gpu" and onload["seconds"] < cold_s
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
