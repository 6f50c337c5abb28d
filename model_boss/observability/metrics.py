"""Prometheus metrics, one registry per coordinator (so tests can run several)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, exposition

from ..scheduling.states import SlotState
from ..slot_key import SlotKey
from .gateway import GatewayCollector

if TYPE_CHECKING:
    from ..tenancy.usage.row import UsageRow

# What generate_latest writes: the text format 0.0.4 (newer prometheus_client releases name
# it CONTENT_TYPE_PLAIN_0_0_4, as their CONTENT_TYPE_LATEST moved on to 1.0.0)
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)


class Metrics:
    """The daemon's counters, gauges and histograms, rendered for ``GET /metrics``."""

    content_type = CONTENT_TYPE

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("model_boss_requests_total", "Requests answered",
                                ["model", "endpoint", "status"], registry=self.registry)
        self.latency = Histogram("model_boss_request_seconds", "Time to answer (headers)",
                                 ["model", "endpoint"], registry=self.registry)
        self.queue_depth = Gauge("model_boss_queue_depth", "Requests waiting",
                                 registry=self.registry)
        self.slot_state = Gauge("model_boss_slot_state", "1 for the state each slot is in",
                                ["model", "state"], registry=self.registry)
        self.gpu_leased = Gauge("model_boss_gpu_leased_mb", "VRAM leased per GPU", ["gpu"],
                                registry=self.registry)
        self.gpu_free = Gauge("model_boss_gpu_free_mb", "Effective free VRAM per GPU", ["gpu"],
                              registry=self.registry)
        self.loads = Counter("model_boss_loads_total", "Model loads", ["model"],
                             registry=self.registry)
        self.load_seconds = Histogram("model_boss_load_seconds", "Cold load time", ["model"],
                                      buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
                                      registry=self.registry)
        self.events = Counter("model_boss_events_total", "Events emitted", ["type"],
                              registry=self.registry)
        self.queue_waiting = Gauge("model_boss_queue_waiting", "Requests waiting, by priority",
                                   ["priority"], registry=self.registry)
        self.queue_limit = Gauge("model_boss_queue_limit",
                                 "Requests that may wait: in all, per client", ["scope"],
                                 registry=self.registry)
        self.queue_rejected = Counter("model_boss_queue_rejected_total",
                                      "Requests refused with 429 by a queue limit",
                                      ["reason", "model"], registry=self.registry)
        self.queue_wait = Histogram("model_boss_queue_wait_seconds",
                                    "Time from submission to a granted slot", ["priority"],
                                    buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
                                    registry=self.registry)
        self.model_max_concurrency = Gauge("model_boss_model_max_concurrency",
                                           "Requests that may run at once on a model",
                                           ["model"], registry=self.registry)
        self.model_running = Gauge("model_boss_model_running", "Requests running on a model",
                                   ["model"], registry=self.registry)
        # the ledger's figures per key (its name; "-" with no keys configured): key names
        # are configured, so their number stays small, unlike end users (never a label)
        self.usage_requests = Counter("model_boss_usage_requests_total",
                                      "Finished requests, by key and how they ended",
                                      ["key", "model", "outcome"], registry=self.registry)
        self.usage_tokens = Counter("model_boss_usage_tokens_total",
                                    "Tokens by key: prompt, completion, cached (of the prompt)",
                                    ["key", "model", "direction"], registry=self.registry)
        self.usage_gpu_seconds = Counter("model_boss_usage_gpu_seconds_total",
                                         "Share of slot busy time (and loads caused), by key",
                                         ["key", "model"], registry=self.registry)
        self.usage_images = Counter("model_boss_usage_images_total", "Images made, by key",
                                    ["key", "model"], registry=self.registry)
        self.usage_audio_seconds = Counter("model_boss_usage_audio_seconds_total",
                                           "Seconds of audio heard (transcriptions), by key",
                                           ["key", "model"], registry=self.registry)
        # the model server protocol's gauges, per model, for an inference gateway's picker
        self.gateway = GatewayCollector()
        self.registry.register(self.gateway)

    def observe_request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(model, endpoint, str(status)).inc()
        self.latency.labels(model, endpoint).observe(seconds)

    def slot_in(self, key: SlotKey, state: SlotState) -> None:
        """The copy ``key`` is in ``state`` (1) and in no other (0). Its series' label
        ``model`` carries the copy's key (``id#n`` past the first): a series per copy."""
        for each in SlotState:
            self.slot_state.labels(key, str(each)).set(int(each == state))

    def observe_wait(self, priority: int, seconds: float) -> None:
        self.queue_wait.labels(str(priority)).observe(seconds)

    def observe_usage(self, row: UsageRow) -> None:
        """Count one ledger row (figures of zero add no series: an LLM shows no images)."""
        key = row.key or "-"
        self.usage_requests.labels(key, row.model, row.outcome).inc()
        for direction, count in (("prompt", row.prompt_tokens),
                                 ("completion", row.completion_tokens),
                                 ("cached", row.cached_tokens)):
            if count > 0:
                self.usage_tokens.labels(key, row.model, direction).inc(count)
        if row.gpu_seconds > 0:
            self.usage_gpu_seconds.labels(key, row.model).inc(row.gpu_seconds)
        if row.images > 0:
            self.usage_images.labels(key, row.model).inc(row.images)
        if row.audio_seconds > 0:
            self.usage_audio_seconds.labels(key, row.model).inc(row.audio_seconds)

    def on_event(self, event: dict) -> None:
        self.events.labels(event["type"]).inc()
        if event["type"] == "queue_rejected":
            self.queue_rejected.labels(event.get("reason", "?"), event.get("model", "?")).inc()
        if event["type"] == "loaded":
            self.loads.labels(event.get("model", "?")).inc()
            self.load_seconds.labels(event.get("model", "?")).observe(event.get("seconds", 0))

    def render(self) -> bytes:
        return exposition.generate_latest(self.registry)
