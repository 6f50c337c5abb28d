"""Running totals per key and hour, kept in memory for admission: what a key has spent since
a moment, without touching the database."""

from __future__ import annotations

from dataclasses import dataclass

from .periods import HOUR_S, hour_of
from .row import UsageRow

# how far back the totals reach (a month's quota starts at most 31 days ago), plus a day's
# margin before old hours are let go
KEPT_S = 31 * 86400
PRUNE_AFTER_S = KEPT_S + 86400


@dataclass(frozen=True, slots=True)
class Spent:
    """What a key used over a period: requests, tokens in and out, images, seconds of audio,
    and GPU-seconds (its share of the slots' busy time)."""

    requests: int = 0
    tokens: int = 0
    images: int = 0
    audio_seconds: float = 0.0
    gpu_seconds: float = 0.0


class _Bucket:
    __slots__ = ("audio_seconds", "gpu_seconds", "images", "requests", "tokens")

    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.images = 0
        self.audio_seconds = 0.0
        self.gpu_seconds = 0.0


class HourlyTotals:
    """Per-key, per-hour sums. ``spent(key, since)`` counts whole hours: the hour holding
    ``since`` is counted in full (day and month starts fall on an hour, so those are exact;
    anything else errs towards more spent, never less)."""

    def __init__(self) -> None:
        self._keys: dict[str, dict[int, _Bucket]] = {}
        self._pruned_hour = 0

    def add(self, row: UsageRow) -> None:
        hour = hour_of(row.at)
        buckets = self._keys.get(row.key)
        if buckets is None:
            buckets = self._keys[row.key] = {}
        bucket = buckets.get(hour)
        if bucket is None:
            bucket = buckets[hour] = _Bucket()
            if hour > self._pruned_hour:
                self._prune(hour)
        bucket.requests += 1
        bucket.tokens += row.prompt_tokens + row.completion_tokens
        bucket.images += row.images
        bucket.audio_seconds += row.audio_seconds
        bucket.gpu_seconds += row.gpu_seconds

    def seed(self, key: str, hour: int, spent: Spent) -> None:
        """Add what the database holds for ``key`` in ``hour`` (at start)."""
        bucket = self._keys.setdefault(key, {}).setdefault(hour, _Bucket())
        bucket.requests += spent.requests
        bucket.tokens += spent.tokens
        bucket.images += spent.images
        bucket.audio_seconds += spent.audio_seconds
        bucket.gpu_seconds += spent.gpu_seconds

    def spent(self, key: str, since: float) -> Spent:
        first = hour_of(since)
        requests = tokens = images = 0
        audio = gpu = 0.0
        for hour, bucket in self._keys.get(key, {}).items():
            if hour >= first:
                requests += bucket.requests
                tokens += bucket.tokens
                images += bucket.images
                audio += bucket.audio_seconds
                gpu += bucket.gpu_seconds
        return Spent(requests, tokens, images, audio, gpu)

    def _prune(self, hour: int) -> None:
        # once per new hour: let go of hours older than any quota period looks at
        self._pruned_hour = hour
        oldest = hour - PRUNE_AFTER_S // HOUR_S
        for key in list(self._keys):
            buckets = self._keys[key]
            for old in [h for h in buckets if h < oldest]:
                del buckets[old]
            if not buckets:
                del self._keys[key]
