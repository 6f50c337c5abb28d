"""What a key may do, decided over plain figures: the kind of route a path is, whether a
key's scope takes a model and a kind, and whether its rates and quotas let one more request
in. Pure functions; the edge (api/middleware/identity.py, admission.py) and the serving path
apply them."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ModelBossError, QuotaExceeded, RateLimited
from ...settings import ClientProfile
from ..usage.periods import day_start, month_start
from ..usage.totals import Spent

MINUTE_S = 60.0


def model_in_scope(profile: ClientProfile, names: Iterable[str]) -> bool:
    """Whether any of a model's ``names`` (its id and aliases) matches the key's globs."""
    globs = profile.allowed_models
    if globs is None:
        return True
    return any(fnmatch.fnmatchcase(name, glob) for name in names for glob in globs)


def kind_in_scope(profile: ClientProfile, kind: str) -> bool:
    return profile.endpoints is None or kind in profile.endpoints


def floored_priority(profile: ClientProfile | None, priority: int) -> int:
    """A priority no more important than the key's floor allows."""
    floor = profile.priority_floor if profile is not None else None
    return priority if floor is None else max(priority, floor)


@dataclass(frozen=True, slots=True)
class MinuteReading:
    """A key's last sliding minute: requests admitted and tokens used, and when each of
    those (oldest first) happened, so a refusal can say when the window frees.
    ``token_total`` is the tokens' sum where the reader keeps it (the windows do: a minute
    at a thousand requests a second is 60,000 events, too many to add up per request)."""

    request_times: Sequence[float] = ()
    token_events: Sequence[tuple[float, int]] = ()
    token_total: int | None = None

    @property
    def tokens(self) -> int:
        if self.token_total is not None:
            return self.token_total
        return sum(n for _, n in self.token_events)


def next_month(now: float) -> float:
    """Midnight UTC of the first day of the month after ``now``'s."""
    return month_start(month_start(now) + 32 * 86400)


def refusal(name: str, profile: ClientProfile, *, now: float, minute: MinuteReading,
            day: Spent, month: Spent, holder: str | None = None) -> ModelBossError | None:
    """Why one more request of the key ``name`` may not start now (a 429 whose Retry-After
    is when it could), else None. Quotas count what is spent; a request is let in while the
    spent figure is under the quota, so requests running at once overspend by their own
    use at most. ``holder`` names whose limits they are in the message (else the key:
    an end user under a key is refused by the same rule)."""
    p = profile
    holder = holder or f"key '{name}'"
    if p.requests_per_minute is not None and len(minute.request_times) >= p.requests_per_minute:
        # the window frees when the request that fills it is a minute old
        times = sorted(minute.request_times)
        frees = times[len(times) - p.requests_per_minute] + MINUTE_S \
            if p.requests_per_minute else now + MINUTE_S
        return _rate(holder, f"{p.requests_per_minute} requests per minute", frees - now)
    if p.tokens_per_minute is not None and minute.tokens >= p.tokens_per_minute:
        left, frees = minute.tokens, now + MINUTE_S
        for at, n in sorted(minute.token_events):
            left -= n
            if left < p.tokens_per_minute:
                frees = at + MINUTE_S
                break
        return _rate(holder, f"{p.tokens_per_minute} tokens per minute", frees - now)
    tomorrow, next_month_at = day_start(now) + 86400, next_month(now)
    for limit, spent, what, resets in (
            (p.tokens_per_day, day.tokens, "tokens_per_day", tomorrow),
            (p.tokens_per_month, month.tokens, "tokens_per_month", next_month_at),
            (p.images_per_day, day.images, "images_per_day", tomorrow),
            (p.audio_seconds_per_day, day.audio_seconds, "audio_seconds_per_day", tomorrow),
            (p.gpu_seconds_per_day, day.gpu_seconds, "gpu_seconds_per_day", tomorrow),
            (p.gpu_seconds_per_month, month.gpu_seconds, "gpu_seconds_per_month",
             next_month_at)):
        if limit is not None and spent >= limit:
            reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resets))
            error = QuotaExceeded(
                f"{holder} has used its quota {what}={limit:g} ({spent:g} used); it "
                f"resets at {reset}", param=what, retry_after_s=max(1.0, resets - now))
            error.details = {"quota": what, "limit": limit, "used": spent, "resets_at": reset}
            return error
    return None


def minute_left(profile: ClientProfile, minute: MinuteReading,
                now: float) -> list[dict[str, Any]]:
    """What is left of a key's per-minute rates (those it has), as OpenAI's
    ``rate_limits.updated`` lists them: each rate's limit, what remains of it, and in how many
    seconds the oldest use in the window leaves it."""
    left = []
    if profile.requests_per_minute is not None:
        times = sorted(minute.request_times)
        left.append(_left("requests", profile.requests_per_minute, len(times),
                          times[0] if times else None, now))
    if profile.tokens_per_minute is not None:
        events = sorted(minute.token_events)
        left.append(_left("tokens", profile.tokens_per_minute, minute.tokens,
                          events[0][0] if events else None, now))
    return left


def _left(name: str, limit: int, used: int, oldest: float | None,
          now: float) -> dict[str, Any]:
    reset = 0.0 if oldest is None else max(0.0, oldest + MINUTE_S - now)
    return {"name": name, "limit": limit, "remaining": max(0, limit - used),
            "reset_seconds": round(reset, 1)}


def _rate(holder: str, limit: str, wait_s: float) -> RateLimited:
    wait_s = max(1.0, wait_s)
    return RateLimited(f"{holder} is over its rate of {limit}; try again in "
                       f"{wait_s:.0f}s", retry_after_s=wait_s)
