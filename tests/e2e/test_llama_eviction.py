"""Two models, a GPU that holds one: eviction, pinning, priorities, keep-alive."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import llama_manifest, wait_for

pytestmark = pytest.mark.slow

ONE_MODEL_GPU = {"gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}]}  # 3584 usable


def chat(server, model: str, **extra) -> httpx.Response:
    body = {"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def resident(server) -> list[str]:
    return [s["model"] for s in server.status()["slots"] if s["state"] != "idle"]


@pytest.fixture
def two_models(demo_gguf):
    return [llama_manifest("model-a", demo_gguf, vram_mb=3000),
            llama_manifest("model-b", demo_gguf, vram_mb=3000)]


def test_alternating_requests_evict_and_reload(make_server, two_models):
    server = make_server(ONE_MODEL_GPU, two_models)
    for model in ["model-a", "model-b", "model-a", "model-b"]:
        response = chat(server, model)
        assert response.status_code == 200, response.text
        assert response.headers["x-model-boss-model"] == model
        assert resident(server) == [model]
        status = server.status()
        assert status["gpus"][0]["leased_mb"] == 3000
        assert len(server.worker_pids()) == 1
    loads = {s["model"]: s["loads"] for s in server.status()["slots"]}
    assert loads == {"model-a": 2, "model-b": 2}
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert sum(e["type"] == "evicted" for e in events) == 3
    for model in ("model-a", "model-b"):
        assert httpx.post(f"{server.url}/api/v1/models/{model}/unload").status_code == 200
    status = server.status()
    assert status["gpus"][0]["leased_mb"] == 0 and status["leases"] == []
    assert server.worker_pids() == set()


def test_pinned_model_is_never_evicted(make_server, demo_gguf):
    manifests = [llama_manifest("pinned", demo_gguf, vram_mb=3000, pin=True),
                 llama_manifest("other", demo_gguf, vram_mb=3000)]
    server = make_server(ONE_MODEL_GPU, manifests)
    assert chat(server, "pinned").status_code == 200
    started = time.monotonic()
    response = chat(server, "other")
    # The other model can never fit beside the pinned one: 503 at once, with Retry-After.
    assert response.status_code == 503
    assert time.monotonic() - started < 5
    assert response.json()["error"]["code"] == "capacity_exceeded"
    assert "pinned" in response.json()["error"]["message"]
    assert int(response.headers["retry-after"]) >= 1
    assert resident(server) == ["pinned"]
    assert chat(server, "pinned").status_code == 200
    # Unpinned through the admin API, it can be evicted again.
    assert httpx.post(server.url + "/api/v1/models/pinned/unpin").status_code == 200
    assert chat(server, "other").status_code == 200
    assert resident(server) == ["other"]


def test_low_priority_cannot_evict_important_model_within_stay_warm(make_server, two_models):
    server = make_server(ONE_MODEL_GPU, two_models)
    assert chat(server, "model-a", x_priority=0).status_code == 200
    started = time.monotonic()
    response = chat(server, "model-b", x_priority=9, x_budget_s=4)
    waited = time.monotonic() - started
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "budget_exceeded"
    assert "retry-after" in response.headers
    assert 3.5 < waited < 12
    assert resident(server) == ["model-a"]
    # An equally important request may evict it.
    assert chat(server, "model-b", x_priority=0).status_code == 200
    assert resident(server) == ["model-b"]


def test_keep_alive_zero_unloads_after_the_response(make_server, two_models):
    server = make_server(ONE_MODEL_GPU, two_models)
    assert chat(server, "model-a", x_keep_alive_s=0).status_code == 200
    wait_for(lambda: resident(server) == [], timeout=15)
    assert server.status()["gpus"][0]["leased_mb"] == 0


def test_stay_warm_expiry_unloads(make_server, demo_gguf):
    manifests = [llama_manifest("brief", demo_gguf, stay_warm_s=1)]
    server = make_server({**ONE_MODEL_GPU, "reaper_interval_s": 0.2}, manifests)
    assert chat(server, "brief").status_code == 200
    assert resident(server) == ["brief"]
    wait_for(lambda: resident(server) == [], timeout=15)
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert any(e["type"] == "unloaded" and e["reason"] == "stay-warm expired" for e in events)
