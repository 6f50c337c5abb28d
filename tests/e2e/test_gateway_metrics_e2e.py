"""A real coordinator serving the demo model (with one LoRA adapter) shows the model server
protocol's gauges on /metrics, in vLLM's names, as an inference gateway's picker reads them:
parsed with prometheus_client's own parser, during a request and after it."""

from __future__ import annotations

import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerProcess, llama_manifest, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    from tests.lora_fixtures import shared_lora

    adapter = shared_lora(tmp_path_factory, "smol-a", 0)
    base = llama_manifest("smol", demo_gguf, parallel=2,
                          adapters=[{"id": "smol-sql", "path": str(adapter)}])
    srv = ServerProcess(tmp_path_factory.mktemp("gateway"), {}, [base])
    srv.start()
    yield srv
    srv.stop()


def scrape(server) -> dict[str, list]:
    """The protocol's families on /metrics: name -> its samples."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)
            if family.name.startswith("vllm:")}


def by_model(samples: list) -> dict[str, float]:
    return {sample.labels["model_name"]: sample.value for sample in samples}


def worker_kv_ratio(server) -> float | None:
    """What the model's llama.cpp worker itself says of its KV cache (recent llama.cpp
    builds no longer export ``llamacpp:kv_cache_usage_ratio``: then None)."""
    slot = next(slot for slot in server.status()["slots"] if slot["model"] == "smol")
    secret = psutil.Process(slot["pid"]).environ()["LLAMA_API_KEY"]  # the worker's own key
    text = httpx.get(f"http://127.0.0.1:{slot['port']}/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {secret}"}).text
    return next((sample.value for family in text_string_to_metric_families(text)
                 for sample in family.samples
                 if sample.name == "llamacpp:kv_cache_usage_ratio"), None)


def check_kv_cache(families: dict[str, list], worker_ratio: float | None) -> None:
    """The KV-cache series is the worker's own figure where it has one, and absent (never 0)
    where it has none."""
    if worker_ratio is None:
        assert "vllm:kv_cache_usage_perc" not in families
    else:
        assert 0 <= by_model(families["vllm:kv_cache_usage_perc"])["smol"] <= 1


def test_the_protocols_gauges_during_and_after_a_request(server):
    long = {"model": "smol-sql", "stream": True, "max_tokens": 400, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=long,
                      timeout=120) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # it is decoding
        during = scrape(server)
        worker_ratio = worker_kv_ratio(server)
    assert by_model(during["vllm:num_requests_running"]) == {"smol": 1}
    assert by_model(during["vllm:num_requests_waiting"]) == {"smol": 0}
    check_kv_cache(during, worker_ratio)

    wait_for(lambda: by_model(scrape(server)["vllm:num_requests_running"]) == {"smol": 0},
             timeout=30)
    after = scrape(server)
    assert by_model(after["vllm:num_requests_waiting"]) == {"smol": 0}
    check_kv_cache(after, worker_kv_ratio(server))
    (lora,) = after["vllm:lora_requests_info"]
    assert lora.labels == {"model_name": "smol", "max_lora": "1",
                           "running_lora_adapters": "smol-sql", "waiting_lora_adapters": ""}
    assert abs(lora.value - time.time()) < 60  # "the last updated timestamp"
