"""Placement and admission with real llama.cpp workers on declared GPUs."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import llama_manifest

pytestmark = pytest.mark.slow


def chat(server, model, **extra):
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
        **extra})


def worker_launch(pid: int) -> tuple[list[str], dict[str, str]]:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    env = dict(item.split("=", 1) for item in
               Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
    return argv, env


def gpu(index: int, usable_mb: int) -> dict:
    return {"index": index, "name": f"sim-{index}", "vram_mb": usable_mb + 512}


def test_estimate_from_gguf_and_split_across_three_small_gpus(make_server, demo_gguf):
    server = make_server({"gpus": [gpu(0, 100), gpu(1, 100), gpu(2, 100)]},
                         [llama_manifest("smol", demo_gguf)])  # no vram_mb in the manifest
    assert chat(server, "smol").status_code == 200
    slot = server.status()["slots"][0]
    assert slot["vram_estimate"]["rung"] == "llama.cpp-fit" and slot["vram_estimate"]["mb"] > 200
    placement = slot["placement"]
    assert placement["kind"] == "split" and len(placement["allocations"]) == 3
    assert sum(placement["allocations"].values()) == slot["vram_estimate"]["mb"]
    argv, env = worker_launch(slot["pid"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    split = argv[argv.index("--tensor-split") + 1].split(",")
    assert len(split) == 3 and abs(sum(map(float, split)) - 1) < 0.01
    assert argv[argv.index("--n-gpu-layers") + 1] == "999"  # every layer, split three ways
    assert {g["index"]: g["leased_mb"] for g in server.status()["gpus"]} == {
        int(k): v for k, v in placement["allocations"].items()}


def test_partial_offload_when_one_gpu_is_too_small(make_server, demo_gguf):
    server = make_server({"gpus": [gpu(0, 230)]},
                         [llama_manifest("smol", demo_gguf, allow_partial=True)])
    assert chat(server, "smol").status_code == 200
    slot = server.status()["slots"][0]
    placement = slot["placement"]
    assert placement["kind"] == "partial"
    assert 0 < placement["gpu_layers"] < placement["total_layers"] == 30
    assert placement["share"].endswith("CPU/GPU")
    argv, env = worker_launch(slot["pid"])
    assert argv[argv.index("--n-gpu-layers") + 1] == str(placement["gpu_layers"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_too_small_without_allow_partial_never_fits(make_server, demo_gguf):
    server = make_server({"gpus": [gpu(0, 230)]}, [llama_manifest("smol", demo_gguf)])
    response = chat(server, "smol")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "capacity_exceeded"


def test_budget_admission_cold_and_warm(make_server, demo_gguf):
    server = make_server({}, [llama_manifest("smol", demo_gguf)])
    started = time.monotonic()
    refused = chat(server, "smol", x_budget_s=0.05)
    elapsed = time.monotonic() - started
    assert refused.status_code == 503 and elapsed < 0.5
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert server.status()["slots"] == [] or server.status()["slots"][0]["state"] == "idle"
    assert chat(server, "smol").status_code == 200  # warm it up
    assert chat(server, "smol", x_budget_s=30).status_code == 200
    learned = server.status()["slots"][0]["learned"]
    assert learned["load_s"] > 0 and learned["infer_s"] > 0 and learned["loads"] == 1
