"""Real diffusers on the CPU: a tiny random-weight pipeline built, saved, loaded by the worker."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, llama_manifest, wait_for, worker_secret
from tests.lazy_modules import lazy

openai = lazy("openai")
Image = lazy("PIL.Image")

pytestmark = pytest.mark.slow

ONE_MODEL_GPU = {"gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}]}


def sd_manifest(path, **extra):
    return {"id": "tiny-sd", "category": "diffusion", "backend": "diffusers",
            "path": str(path), "vram_mb": 3000, **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_sd, demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("diffusion"), ONE_MODEL_GPU,
                        [sd_manifest(tiny_sd), llama_manifest("smol", demo_gguf, vram_mb=3000)])
    srv.start()
    yield srv
    srv.stop()


def slot(server, model):
    return next(s for s in server.status()["slots"] if s["model"] == model)


def worker_health(server, model="tiny-sd"):
    worker = slot(server, model)  # the worker answers only with the coordinator's secret
    secret = worker_secret(worker["pid"])
    return httpx.get(f"http://127.0.0.1:{worker['port']}/health",
                     headers={"Authorization": f"Bearer {secret}"}).json()


def test_openai_client_generates_pngs_of_the_requested_size(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    result = client.images.generate(model="tiny-sd", prompt="a red square", n=2,
                                    size="64x96", extra_body={"x_steps": 2, "x_seed": 7})
    assert len(result.data) == 2
    for item in result.data:
        image = Image.open(io.BytesIO(base64.b64decode(item.b64_json)))
        assert image.format == "PNG" and image.size == (64, 96)
    raw = httpx.post(server.url + "/v1/images/generations", timeout=120, json={
        "model": "tiny-sd", "prompt": "a red square", "size": "64x64", "x_steps": 2,
        "x_seed": 7, "response_format": "url"}).json()
    assert raw["x_model_boss"]["seed"] == 7
    assert raw["x_model_boss"]["memory_decisions"]["vae"] == "cpu-device"
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert any(e["type"] == "vae_decision" and e["vae"] == "cpu-device" for e in events)
    png = httpx.get(raw["data"][0]["url"])
    assert png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).size == (64, 64)


@pytest.mark.parametrize("body, param", [
    ({"size": "63x64"}, "size"), ({"size": "big"}, "size"), ({"size": "0x0"}, "size"),
    ({"size": "8192x8192"}, "size"), ({"n": 0}, "n"), ({"n": 11}, "n"), ({"prompt": ""}, "prompt"),
    ({"response_format": "gif"}, "response_format"), ({"x_steps": 0}, "x_steps"),
])
def test_bad_image_requests_are_400(server, body, param):
    response = httpx.post(server.url + "/v1/images/generations",
                          json={"model": "tiny-sd", "prompt": "x", **body})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_image_job_with_progress_and_a_cancelled_job(server):
    job = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/images/generations",
        "body": {"model": "tiny-sd", "prompt": "slow", "size": "128x128", "x_steps": 10,
                 "x_client_id": "painter"}}).json()
    seen = set()

    def finished():
        state = httpx.get(f"{server.url}/api/v1/jobs/{job['id']}").json()
        if state["progress"].get("step"):
            seen.add(state["progress"]["step"])
        return state if state["status"] in ("succeeded", "failed") else None

    done = wait_for(finished, timeout=120, interval=0.1)
    assert done["status"] == "succeeded", done
    assert len(done["result"]["data"]) == 1 and done["model"] == "tiny-sd"
    assert len(seen) >= 2 and max(seen) <= 10
    doomed = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/images/generations",
        "body": {"model": "tiny-sd", "prompt": "never", "size": "128x128",
                 "x_steps": 200}}).json()
    wait_for(lambda: httpx.get(f"{server.url}/api/v1/jobs/{doomed['id']}").json()[
        "progress"].get("step"), timeout=60, interval=0.05)
    cancelled = httpx.delete(f"{server.url}/api/v1/jobs/{doomed['id']}").json()
    assert cancelled["status"] == "cancelled"
    # the worker stops denoising and is free again
    wait_for(lambda: not worker_health(server)["generating"], timeout=20)
    assert worker_health(server)["progress"]["step"] < 200


def test_llm_evicts_diffusion_to_cpu_and_back_without_a_disk_load(server):
    image = {"model": "tiny-sd", "prompt": "x", "size": "64x64", "x_steps": 1}
    assert httpx.post(server.url + "/v1/images/generations", json=image,
                      timeout=120).status_code == 200
    pid = slot(server, "tiny-sd")["pid"]
    assert worker_health(server)["loads_from_disk"] == 1
    chat = {"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=chat,
                      timeout=120).status_code == 200
    parked = slot(server, "tiny-sd")
    assert parked["state"] == "offloaded" and parked["tier"] == "cpu"
    assert parked["lease"] is None and parked["ram_reserved_mb"] > 0
    assert worker_health(server)["tier"] == "cpu"
    assert server.status()["gpus"][0]["leased_mb"] == 3000  # only the LLM
    assert httpx.post(server.url + "/v1/images/generations", json=image,
                      timeout=120).status_code == 200
    back = slot(server, "tiny-sd")
    assert back["state"] == "ready" and back["pid"] == pid and back["last_onload_s"] is not None
    assert worker_health(server)["loads_from_disk"] == 1
    # On a declared GPU the CPU footprint is shown but the manifest's figure still rules,
    # so the LLM (which has no CPU tier) was stopped to make room again.
    assert back["measured_mb"] >= 1 and back["vram_estimate"]["rung"] == "manifest"
    assert slot(server, "smol")["state"] == "idle"
    assert server.status()["gpus"][0]["leased_mb"] == 3000
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert any(e["type"] == "offloaded" and e["model"] == "tiny-sd" for e in events)
    assert any(e["type"] == "onloaded" and e["model"] == "tiny-sd" for e in events)
    assert slot(server, "tiny-sd")["measured_mb"] >= 1


def test_without_ram_budget_the_offloaded_slot_is_stopped(make_server, tiny_sd, demo_gguf):
    server = make_server({**ONE_MODEL_GPU, "max_offloaded_mb": 0},
                         [sd_manifest(tiny_sd), llama_manifest("smol", demo_gguf,
                                                               vram_mb=3000)])
    image = {"model": "tiny-sd", "prompt": "x", "size": "64x64", "x_steps": 1}
    assert httpx.post(server.url + "/v1/images/generations", json=image,
                      timeout=120).status_code == 200
    pid = slot(server, "tiny-sd")["pid"]
    chat = {"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=chat,
                      timeout=120).status_code == 200
    stopped = slot(server, "tiny-sd")
    assert stopped["state"] == "idle" and stopped["pid"] is None
    wait_for(lambda: pid not in server.worker_pids(), timeout=10)
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert any(e["type"] == "offload_skipped" for e in events)
    assert any(e["type"] == "evicted" and e["tier"] == "disk" for e in events)


def test_worker_exits_when_its_parent_pid_goes(tmp_path):
    """The ``--parent-pid`` watch (the worker's own parent lives on, so PR_SET_PDEATHSIG does
    not fire; tests/e2e/test_diffusers_worker.py covers that and SIGTERM mid-generation). Its
    model is a folder that is not a pipeline: the load fails at once and the worker stays up,
    saying so, until its parent goes."""
    port, model = free_port(), tmp_path / "not-a-pipeline"
    model.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = subprocess.Popen([sys.executable, "-m", "workers.diffusers", "--model",
                               str(model), "--port", str(port), "--parent-pid",
                               str(parent.pid)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _state(port) == "failed", timeout=60)
        parent.kill()
        parent.wait()
        assert worker.wait(timeout=10) == 0  # noticed the parent is gone
    finally:
        worker.kill()
        parent.kill()


def test_the_worker_answers_only_the_coordinator(server):
    """Every worker is private: started with a secret only the coordinator knows (in its
    environment, never on its command line), ``/health`` included."""
    image = {"model": "tiny-sd", "prompt": "x", "size": "64x64", "x_steps": 1}
    assert httpx.post(server.url + "/v1/images/generations", json=image,
                      timeout=120).status_code == 200
    worker = slot(server, "tiny-sd")
    argv = Path(f"/proc/{worker['pid']}/cmdline").read_bytes().decode().split("\0")
    secret = worker_secret(worker["pid"])
    assert len(secret) >= 32 and not any(secret in part for part in argv)
    url = f"http://127.0.0.1:{worker['port']}"
    for path in ("/health", "/progress"):
        refused = httpx.get(url + path)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(url + "/generate", json={"prompt": "x"}).status_code == 401
    assert httpx.get(url + "/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url + "/health",
                     headers={"Authorization": f"Bearer {secret}"}).status_code == 200


def _state(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["state"]
    except httpx.HTTPError:
        return None
