"""The model server protocol's gauges (model_boss.observability.gateway): rendered from a
snapshot, table-tested; read off a coordinator's slots and queue through GET /metrics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from model_boss.backends.llama.report import kv_cache_ratio
from model_boss.observability.gateway import GatewayCollector, ModelLoad

from .fakes import coordinator, manifest, started_client

NOW = 1_764_400_000.0


def samples(loads: list[ModelLoad]) -> list[str]:
    """The sample lines /metrics would carry for ``loads`` (no HELP or TYPE lines)."""
    registry = CollectorRegistry()
    collector = GatewayCollector(clock=lambda: NOW)
    registry.register(collector)
    collector.update(loads)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if not line.startswith("#")]


CASES = [
    pytest.param([], [], id="nothing served: no series"),
    pytest.param(
        [ModelLoad("qwen", waiting=3, running=2, kv_cache_usage=0.25)],
        ['vllm:num_requests_waiting{model_name="qwen"} 3.0',
         'vllm:num_requests_running{model_name="qwen"} 2.0',
         'vllm:kv_cache_usage_perc{model_name="qwen"} 0.25'],
        id="a loaded llama.cpp model"),
    pytest.param(
        [ModelLoad("sdxl", waiting=1)],
        ['vllm:num_requests_waiting{model_name="sdxl"} 1.0',
         'vllm:num_requests_running{model_name="sdxl"} 0.0'],
        id="KV-cache use unknown: its series left out, never 0"),
    pytest.param(
        [ModelLoad("base", running=1, kv_cache_usage=0.0, adapters=("base-a", "base-b"),
                   running_adapters=("base-a", "base-b"))],
        ['vllm:num_requests_waiting{model_name="base"} 0.0',
         'vllm:num_requests_running{model_name="base"} 1.0',
         'vllm:kv_cache_usage_perc{model_name="base"} 0.0',
         'vllm:lora_requests_info{max_lora="2",model_name="base",'
         'running_lora_adapters="base-a,base-b",waiting_lora_adapters=""} 1.7644e+09'],
        id="a ready base with adapters: loaded ones run, the value is the time read"),
    pytest.param(
        [ModelLoad("base", waiting=2, adapters=("base-a",))],
        ['vllm:num_requests_waiting{model_name="base"} 2.0',
         'vllm:num_requests_running{model_name="base"} 0.0',
         'vllm:lora_requests_info{max_lora="1",model_name="base",'
         'running_lora_adapters="",waiting_lora_adapters=""} 1.7644e+09'],
        id="a base not loaded: its adapters counted in max_lora, none running"),
    pytest.param(
        [ModelLoad("b", waiting=1), ModelLoad("a", running=4, kv_cache_usage=0.5)],
        ['vllm:num_requests_waiting{model_name="a"} 0.0',
         'vllm:num_requests_waiting{model_name="b"} 1.0',
         'vllm:num_requests_running{model_name="a"} 4.0',
         'vllm:num_requests_running{model_name="b"} 0.0',
         'vllm:kv_cache_usage_perc{model_name="a"} 0.5'],
        id="several models: one series each, by id"),
]


@pytest.mark.parametrize(("loads", "lines"), CASES)
def test_rendering(loads: list[ModelLoad], lines: list[str]) -> None:
    assert samples(loads) == lines


def test_families_parse_with_their_types() -> None:
    text = generate_latest(_registry([ModelLoad("m", 1, 2, 0.5, ("x",), ("x",))])).decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families == {"vllm:num_requests_waiting": "gauge",
                        "vllm:num_requests_running": "gauge",
                        "vllm:kv_cache_usage_perc": "gauge",
                        "vllm:lora_requests_info": "gauge"}


def _registry(loads: list[ModelLoad]) -> CollectorRegistry:
    registry = CollectorRegistry()
    collector = GatewayCollector(clock=lambda: NOW)
    registry.register(collector)
    collector.update(loads)
    return registry


def _values(text: str, name: str) -> dict[str, float]:
    return {s.labels["model_name"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


async def test_coordinator_exposes_them_beside_its_own(tmp_path) -> None:
    coord, _log = coordinator(tmp_path, [manifest("counted"), manifest("uncounted", 500),
                                         manifest("never-loaded", 500)])
    async with started_client(coord) as client:
        await coord.pool.ensure_ready("counted", 50)
        await coord.pool.ensure_ready("uncounted", 50)
        coord.pool.slot("counted").backend.kv_cache = 0.375
        text = (await client.get("/metrics")).text
    assert _values(text, "vllm:num_requests_waiting") == {"counted": 0, "uncounted": 0}
    assert _values(text, "vllm:num_requests_running") == {"counted": 0, "uncounted": 0}
    # a worker that does not count its cache, and a model never loaded: no series
    assert _values(text, "vllm:kv_cache_usage_perc") == {"counted": 0.375}
    assert "vllm:lora_requests_info" not in text  # no model here has adapters: no family
    assert "model_boss_queue_depth 0.0" in text  # model-boss's own names stay


@pytest.mark.parametrize(("status", "page", "ratio"), [
    (200, "llamacpp:requests_processing 1\nllamacpp:kv_cache_usage_ratio 0.42\n", 0.42),
    (200, "llamacpp:requests_processing 1\n", None),  # a build that no longer exports it
    (501, "metrics off", None),  # a server started without --metrics
])
async def test_a_llama_servers_kv_cache_ratio(status: int, page: str, ratio: float | None) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, text=page))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        assert await kv_cache_ratio(client) == ratio
