"""Running totals per key and hour, and per end user under a key, kept in memory for
admission: what a key (or one of its end users) has spent since a moment, without touching
the database."""

from __future__ import annotations

from dataclasses import dataclass

from .periods import HOUR_S, hour_of
from .row import UsageRow

# how far back the totals reach (a month's quota starts at most 31 days ago), plus a day's
# margin before old hours are let go
KEPT_S = 31 * 86400
PRUNE_AFTER_S = KEPT_S + 86400
HOURS_A_DAY = 24

# whose totals: a key's name, or (key, end user) for an end user under it
Spender = str | tuple[str, str]


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

    def add(self, requests: int, tokens: int, images: int, audio_seconds: float,
            gpu_seconds: float) -> None:
        self.requests += requests
        self.tokens += tokens
        self.images += images
        self.audio_seconds += audio_seconds
        self.gpu_seconds += gpu_seconds


class HourlyTotals:
    """Per-key, per-hour sums, and per-key, per-day sums of those hours; the same per
    (key, end user) for rows that name an end user under a key. ``spent(key, since)``
    counts whole hours: the hour holding ``since`` is counted in full (day and month starts
    fall on an hour, so those are exact; anything else errs towards more spent, never less).
    It adds whole days, and the hours before the first of them: asked twice on every keyed
    request, it reads at most 32 days and 23 hours, not the 744 hours of a month."""

    def __init__(self) -> None:
        self._keys: dict[Spender, dict[int, _Bucket]] = {}
        self._days: dict[Spender, dict[int, _Bucket]] = {}
        self._pruned_hour = 0

    def add(self, row: UsageRow) -> None:
        hour = hour_of(row.at)
        if hour > self._pruned_hour:
            self._prune(hour)
        spenders: tuple[Spender, ...] = (row.key, (row.key, row.end_user)) \
            if row.key and row.end_user else (row.key,)
        for spender in spenders:
            self._add(spender, hour, 1, row.prompt_tokens + row.completion_tokens, row.images,
                      row.audio_seconds, row.gpu_seconds)

    def seed(self, key: Spender, hour: int, spent: Spent) -> None:
        """Add what the database holds for ``key`` in ``hour`` (at start)."""
        self._add(key, hour, spent.requests, spent.tokens, spent.images, spent.audio_seconds,
                  spent.gpu_seconds)

    def spent(self, key: Spender, since: float) -> Spent:
        first = hour_of(since)
        first_day = -(-first // HOURS_A_DAY)  # the first day that starts at or after it
        whole_from = first_day * HOURS_A_DAY
        hours = self._keys.get(key, {})
        counted = [hours[h] for h in range(first, whole_from) if h in hours]
        counted += [b for day, b in self._days.get(key, {}).items() if day >= first_day]
        requests = tokens = images = 0
        audio = gpu = 0.0
        for bucket in counted:  # one pass: five sums of generators cost twice as much
            requests += bucket.requests
            tokens += bucket.tokens
            images += bucket.images
            audio += bucket.audio_seconds
            gpu += bucket.gpu_seconds
        return Spent(requests, tokens, images, audio, gpu)

    def _add(self, key: Spender, hour: int, requests: int, tokens: int, images: int,
             audio_seconds: float, gpu_seconds: float) -> None:
        """Add to the hour's sums and to its day's."""
        for buckets, at in ((self._keys, hour), (self._days, hour // HOURS_A_DAY)):
            of_key = buckets.get(key)
            if of_key is None:
                of_key = buckets[key] = {}
            bucket = of_key.get(at)
            if bucket is None:
                bucket = of_key[at] = _Bucket()
            bucket.add(requests, tokens, images, audio_seconds, gpu_seconds)

    def _prune(self, hour: int) -> None:
        # once per new hour: let go of hours older than any quota period looks at
        self._pruned_hour = hour
        oldest = hour - PRUNE_AFTER_S // HOUR_S
        for key in list(self._keys):
            buckets = self._keys[key]
            for old in [h for h in buckets if h < oldest]:
                del buckets[old]
            days = self._days.get(key, {})
            for old in [d for d in days if d < oldest // HOURS_A_DAY]:
                del days[old]
            if not buckets:
                del self._keys[key]
                self._days.pop(key, None)

