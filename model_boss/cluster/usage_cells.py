"""The cluster's usage counters as plain data: what rows add to which Redis hash and field
(:func:`increments`, :func:`seed_increments`), the script that applies a batch once, and the
usage answer summed from hourly cells (:func:`aggregate`). Pure; :mod:`.tenants` acts."""

from __future__ import annotations

import calendar
import json
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..tenancy.usage import SUMMED, UsageRow, hour_of

HOUR_TTL_S = 400 * 86400
DAY_TTL_S = 3 * 86400
MONTH_TTL_S = 40 * 86400
BATCH_TTL_S = 86400
DIMENSIONS = ("key", "end_user", "model", "endpoint", "outcome", "member")
# counts kept whole in answers; the rest are seconds
WHOLE = {"requests", "prompt_tokens", "completion_tokens", "cached_tokens", "images", "steps"}

# KEYS[1] the batch marker; ARGV[1] its TTL, ARGV[2] the number of (hash, field, amount)
# triples that follow, then (hash, ttl) pairs. Applied once per marker.
APPLY_BATCH = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local n = tonumber(ARGV[2])
local i = 3
for _ = 1, n do
  redis.call('HINCRBYFLOAT', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
while i <= #ARGV do
  redis.call('EXPIRE', ARGV[i], ARGV[i + 1])
  i = i + 2
end
return 1
"""

def day_of(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


def month_of(at: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(at))


def increments(rows: Iterable[UsageRow], base: str) -> dict[tuple[str, str], float]:
    """What ``rows`` add, by (hash, field): each key's day and month counters and the hourly
    figures by every dimension. Pure."""
    adds: dict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        if row.key:
            quota = {"requests": 1, "tokens": row.tokens, "images": row.images,
                     "audio_seconds": row.audio_seconds, "gpu_seconds": row.gpu_seconds}
            for period in (f"day:{day_of(row.at)}", f"month:{month_of(row.at)}"):
                for name, amount in quota.items():
                    if amount:
                        adds[(f"{base}:usage:{period}:{row.key}", name)] += amount
        cell = json.dumps([getattr(row, d) for d in DIMENSIONS])
        hour = f"{base}:usage:hour:{hour_of(row.at)}"
        adds[(hour, f"{cell}|requests")] += 1
        for name in SUMMED:
            amount = getattr(row, name)
            if amount:
                adds[(hour, f"{cell}|{name}")] += amount
    return adds


def seed_increments(summed: list[dict[str, Any]], base: str) -> dict[tuple[str, str], float]:
    """What a ledger's rows summed by hour and every dimension add (a member seeding a
    Redis that restarted empty). Pure."""
    adds: dict[tuple[str, str], float] = defaultdict(float)
    for row in summed:
        at = float(calendar.timegm(time.strptime(row["hour"], "%Y-%m-%dT%H:00Z")))
        if row["key"]:
            quota = {"requests": row["requests"],
                     "tokens": row["prompt_tokens"] + row["completion_tokens"],
                     "images": row["images"], "audio_seconds": row["audio_seconds"],
                     "gpu_seconds": row["gpu_seconds"]}
            for period in (f"day:{day_of(at)}", f"month:{month_of(at)}"):
                for name, amount in quota.items():
                    if amount:
                        adds[(f"{base}:usage:{period}:{row['key']}", name)] += amount
        cell = json.dumps([row[d] for d in DIMENSIONS])
        hour = f"{base}:usage:hour:{hour_of(at)}"
        for name in ("requests", *SUMMED):
            if row[name]:
                adds[(hour, f"{cell}|{name}")] += row[name]
    return adds


def aggregate(hours: dict[int, dict[str, float]], group_by: list[str], *,
              key: str | None = None, model: str | None = None,
              endpoint: str | None = None) -> list[dict[str, Any]]:
    """The usage answer from hourly cells (hour → ``"[dims]|figure"`` → amount), grouped by
    ``group_by`` and filtered as the ledger's query is. Pure."""
    groups: dict[tuple, dict[str, float]] = {}
    wanted = {"key": key, "model": model, "endpoint": endpoint}
    for hour, cells in hours.items():
        at = hour * 3600
        moments = {"day": day_of(at), "hour": time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(at))}
        for field, amount in cells.items():
            cell, _, figure = field.rpartition("|")
            try:
                dims = dict(zip(DIMENSIONS, json.loads(cell), strict=True))
            except (ValueError, TypeError):
                continue
            if any(value is not None and dims[name] != value for name, value in wanted.items()):
                continue
            group = tuple(moments[name] if name in moments else dims[name] for name in group_by)
            sums = groups.setdefault(group, defaultdict(float))
            sums[figure] += amount
    rows = []
    for group in sorted(groups):
        sums = groups[group]
        if not sums.get("requests"):
            continue
        row: dict[str, Any] = dict(zip(group_by, group, strict=True))
        for name in ("requests", *SUMMED):
            value = sums.get(name, 0.0)
            row[name] = int(round(value)) if name in WHOLE else round(value, 6)
        rows.append(row)
    return rows


def batch_args(adds: dict[tuple[str, str], float]) -> list[Any]:
    """The script's arguments: its marker's TTL, the triples, then each hash's TTL."""
    args: list[Any] = [BATCH_TTL_S, len(adds)]
    ttls: dict[str, int] = {}
    for (name, field), amount in adds.items():
        args += [name, field, repr(float(amount))]
        ttls[name] = HOUR_TTL_S if ":hour:" in name else (
            DAY_TTL_S if ":day:" in name else MONTH_TTL_S)
    for name, ttl in ttls.items():
        args += [name, ttl]
    return args
