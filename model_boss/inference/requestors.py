"""RequestorRegistry: per-client counts, in-flight requests, latency and failure cooldowns."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True)
class RequestorStats:
    client_id: str
    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    rejected: int = 0
    in_flight: int = 0
    queued: int = 0
    total_latency_s: float = 0.0
    consecutive_failures: int = 0
    cooldown_until: float = 0.0
    last_seen: float = 0.0

    @property
    def mean_latency_s(self) -> float | None:
        done = self.succeeded + self.failed
        return round(self.total_latency_s / done, 4) if done else None

    def to_dict(self) -> dict:
        return {
            "client_id": self.client_id, "submitted": self.submitted,
            "succeeded": self.succeeded, "failed": self.failed, "rejected": self.rejected,
            "in_flight": self.in_flight, "queued": self.queued,
            "mean_latency_s": self.mean_latency_s,
            "consecutive_failures": self.consecutive_failures,
            "cooldown_until": self.cooldown_until or None, "last_seen": self.last_seen,
        }


class RequestorRegistry:
    """Who is asking for what. A client that fails ``failure_threshold`` times in a row is
    cooled down for ``cooldown_s`` (its requests get 429 with Retry-After)."""

    def __init__(self, failure_threshold: int = 5, cooldown_s: float = 30.0) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clients: dict[str, RequestorStats] = {}

    def get(self, client_id: str) -> RequestorStats:
        stats = self._clients.get(client_id)
        if stats is None:
            stats = self._clients[client_id] = RequestorStats(client_id)
        return stats

    def cooldown_left(self, client_id: str, now: float | None = None) -> float:
        stats = self._clients.get(client_id)
        if stats is None:
            return 0.0
        return max(0.0, stats.cooldown_until - (now or time.time()))

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

    def finished(self, client_id: str, ok: bool, latency_s: float,
                 counts_as_failure: bool = True) -> None:
        stats = self.get(client_id)
        stats.in_flight = max(0, stats.in_flight - 1)
        stats.total_latency_s += latency_s
        if ok:
            stats.succeeded += 1
            stats.consecutive_failures = 0
            return
        stats.failed += 1
        if counts_as_failure:
            stats.consecutive_failures += 1
            if stats.consecutive_failures >= self.failure_threshold:
                stats.cooldown_until = time.time() + self.cooldown_s

    def to_list(self) -> list[dict]:
        return [s.to_dict() for s in sorted(self._clients.values(), key=lambda s: s.client_id)]
