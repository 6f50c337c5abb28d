"""The periods quotas are counted over, in UTC: the hour, the day and the month a moment is in."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

HOUR_S = 3600
DAY_S = 86400


def hour_of(at: float) -> int:
    """The hour ``at`` falls in, as whole hours since the epoch (the ledger's bucket index)."""
    return int(at // HOUR_S)


def day_start(now: float) -> float:
    """Midnight UTC of the day ``now`` (Unix seconds) is in (Unix time has no leap seconds:
    every day is DAY_S long; asked on every keyed request, so no datetime)."""
    return now - now % DAY_S


def month_start(now: float) -> float:
    """Midnight UTC of the first day of the month ``now`` is in."""
    return _month_start_of_day(int(now // DAY_S))


@lru_cache(maxsize=64)
def _month_start_of_day(day: int) -> float:
    moment = datetime.fromtimestamp(day * DAY_S, UTC)
    return moment.replace(day=1).timestamp()
