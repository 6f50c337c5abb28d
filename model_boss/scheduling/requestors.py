"""RequestorRegistry: per-client counts, in-flight requests and latency; per-model failure
cooldowns.

A cooldown belongs to the model whose worker failed, never to a client: a client's own
mistakes (4xx) never count, and clients without an id are not lumped into one client that a
stranger's failures could cool down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True)
class RequestorStats:
    """What one client asked for and how it went (observability only: nothing is refused on
    these numbers)."""

    client_id: str
    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    client_errors: int = 0
    rejected: int = 0
    in_flight: int = 0
    queued: int = 0
    total_latency_s: float = 0.0
    last_seen: float = 0.0

    @property
    def mean_latency_s(self) -> float | None:
        done = self.succeeded + self.failed + self.client_errors
        return round(self.total_latency_s / done, 4) if done else None

    def to_dict(self) -> dict:
        return {
            "client_id": self.client_id, "submitted": self.submitted,
            "succeeded": self.succeeded, "failed": self.failed,
            "client_errors": self.client_errors, "rejected": self.rejected,
            "in_flight": self.in_flight, "queued": self.queued,
            "mean_latency_s": self.mean_latency_s, "last_seen": self.last_seen,
        }


@dataclass(slots=True)
class ModelHealth:
    """A model's run of worker failures and the cooldown it earned."""

    model_id: str
    consecutive_failures: int = 0
    cooldown_until: float = 0.0

    def to_dict(self) -> dict:
        return {"model": self.model_id, "consecutive_failures": self.consecutive_failures,
                "cooldown_until": self.cooldown_until or None}


class RequestorRegistry:
    """Who is asking for what, and which models keep failing. A model whose worker fails
    ``failure_threshold`` requests in a row (crashes, 5xx answers, broken streams) is cooled
    down for ``cooldown_s``: requests for it are refused with Retry-After instead of
    reloading a worker that keeps failing. A success ends the run; a client fault (a 4xx, a
    client that went away) neither counts nor ends it."""

    def __init__(self, failure_threshold: int = 5, cooldown_s: float = 30.0) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clients: dict[str, RequestorStats] = {}
        self._models: dict[str, ModelHealth] = {}

    def known(self, client_id: str) -> RequestorStats | None:
        """A client's figures, None for one never seen (nothing is kept for it)."""
        return self._clients.get(client_id)

    def get(self, client_id: str) -> RequestorStats:
        stats = self._clients.get(client_id)
        if stats is None:
            stats = self._clients[client_id] = RequestorStats(client_id)
        return stats

    def health(self, model_id: str) -> ModelHealth:
        health = self._models.get(model_id)
        if health is None:
            health = self._models[model_id] = ModelHealth(model_id)
        return health

    def cooldown_left(self, model_id: str, now: float | None = None) -> float:
        """Seconds until ``model_id`` takes requests again (0: it takes them now)."""
        health = self._models.get(model_id)
        if health is None:
            return 0.0
        return max(0.0, health.cooldown_until - (now or time.time()))

    def submitted(self, client_id: str) -> None:
        stats = self.get(client_id)
        stats.submitted += 1
        stats.queued += 1
        stats.last_seen = time.time()

    def started(self, client_id: str) -> None:
        stats = self.get(client_id)
        stats.queued = max(0, stats.queued - 1)
        stats.in_flight += 1

    def dequeued(self, client_id: str, rejected: bool = False) -> None:
        stats = self.get(client_id)
        stats.queued = max(0, stats.queued - 1)
        if rejected:
            stats.rejected += 1

    def finished(self, client_id: str, model_id: str, ok: bool, latency_s: float, *,
                 client_fault: bool = False, now: float | None = None) -> None:
        """A granted request is done: ``ok``, a client fault, or a failure of the model."""
        stats = self.get(client_id)
        stats.in_flight = max(0, stats.in_flight - 1)
        stats.total_latency_s += latency_s
        health = self.health(model_id)
        if ok:
            stats.succeeded += 1
            health.consecutive_failures = 0
        elif client_fault:
            stats.client_errors += 1
        else:
            stats.failed += 1
            health.consecutive_failures += 1
            if health.consecutive_failures >= self.failure_threshold:
                health.cooldown_until = (now or time.time()) + self.cooldown_s

    def to_list(self) -> list[dict]:
        return [s.to_dict() for s in sorted(self._clients.values(), key=lambda s: s.client_id)]

    def models_failing(self) -> list[dict]:
        """Models in a run of failures (cooling down or on their way to it)."""
        return [h.to_dict() for h in sorted(self._models.values(), key=lambda h: h.model_id)
                if h.consecutive_failures]
