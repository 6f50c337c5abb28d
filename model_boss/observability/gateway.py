"""The metrics an inference gateway's endpoint picker reads, in the names of the Gateway API
Inference Extension's model server protocol (docs/proposals/003-model-server-protocol):
vLLM's, which the reference picker (and llm-d's) reads by default.

One series per model served here (label ``model_name``, the model id), from a snapshot the
coordinator takes at each scrape (:class:`ModelLoad`); rendering is a pure function of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# the protocol's names for vLLM (its table's "vLLM metric" column, and its LoRA section)
WAITING = "vllm:num_requests_waiting"  # TotalQueuedRequests
RUNNING = "vllm:num_requests_running"  # TotalRunningRequests
KV_CACHE = "vllm:kv_cache_usage_perc"  # KVCacheUtilization (a fraction, 0 to 1, as vLLM's)
LORA_INFO = "vllm:lora_requests_info"  # the LoRA adapter metric


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """What one model has waiting and running here, as the picker sees it.

    ``kv_cache_usage`` is None when unknown (not loaded, or a worker that does not count
    it): its series is then left out, never shown as 0. ``adapters`` are the base's LoRA
    adapters (its worker loads them all, so their number is ``max_lora``)."""

    model: str
    waiting: int = 0
    running: int = 0
    kv_cache_usage: float | None = None
    adapters: tuple[str, ...] = ()
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()


def protocol_families(loads: Sequence[ModelLoad], now: float) -> list[Metric]:
    """The protocol's gauges for ``loads``, those with a series; the LoRA gauge only for
    models with adapters, its value ``now`` (the protocol: "the last updated timestamp")."""
    waiting = GaugeMetricFamily(WAITING, "Requests waiting in the queue for the model",
                                labels=["model_name"])
    running = GaugeMetricFamily(RUNNING, "Requests running on the model's worker",
                                labels=["model_name"])
    kv_cache = GaugeMetricFamily(KV_CACHE, "KV-cache use of the model's worker (1 is full), "
                                 "where its worker counts it", labels=["model_name"])
    lora = GaugeMetricFamily(LORA_INFO, "LoRA adapters on the model: loaded (running), asked "
                             "for and waiting; the value is when this was read (unix time)",
                             labels=["model_name", "max_lora", "running_lora_adapters",
                                     "waiting_lora_adapters"])
    for load in sorted(loads, key=lambda item: item.model):
        waiting.add_metric([load.model], load.waiting)
        running.add_metric([load.model], load.running)
        if load.kv_cache_usage is not None:
            kv_cache.add_metric([load.model], load.kv_cache_usage)
        if load.adapters:
            lora.add_metric([load.model, str(len(load.adapters)),
                             ",".join(load.running_adapters), ",".join(load.waiting_adapters)],
                            now)
    return [family for family in (waiting, running, kv_cache, lora) if family.samples]


class GatewayCollector(Collector):
    """Yields :func:`protocol_families` of the last snapshot given to :meth:`update`."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._loads: tuple[ModelLoad, ...] = ()
        self._clock = clock

    def update(self, loads: Iterable[ModelLoad]) -> None:
        self._loads = tuple(loads)

    def collect(self) -> Iterator[Metric]:
        yield from protocol_families(self._loads, self._clock())
