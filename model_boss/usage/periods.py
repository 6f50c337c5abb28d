"""The periods quotas are counted over, in UTC: the hour, the day and the month a moment is in."""

from __future__ import annotations

from datetime import UTC, datetime

HOUR_S = 3600


def hour_of(at: float) -> int:
    """The hour ``at`` falls in, as whole hours since the epoch (the ledger's bucket index)."""
    return int(at // HOUR_S)


def day_start(now: float) -> float:
    """Midnight UTC of the day ``now`` (Unix seconds) is in."""
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_start(now: float) -> float:
    """Midnight UTC of the first day of the month ``now`` is in."""
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
