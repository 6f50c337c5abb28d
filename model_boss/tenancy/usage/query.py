"""The one query over the ledger: filter by time, key, model and endpoint, group, sum."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from ...errors import BadRequest
from .row import SUMMED
from .schema import INTEGER_COLUMNS

# what a usage answer can be grouped by, and the SQL of each (day and hour in UTC)
GROUPS: dict[str, str] = {
    "key": "key",
    "end_user": "end_user",
    "model": "model",
    "endpoint": "endpoint",
    "outcome": "outcome",
    "member": "member",
    "day": "strftime('%Y-%m-%d', at, 'unixepoch')",
    "hour": "strftime('%Y-%m-%dT%H:00Z', at, 'unixepoch')",
}


def group_names(group_by: list[str]) -> list[str]:
    """``group_by`` checked (each name once, in the order given); an unknown name is a
    BadRequest naming the ``group_by`` parameter."""
    unknown = [name for name in group_by if name not in GROUPS]
    if unknown:
        raise BadRequest(f"group_by: unknown {', '.join(repr(n) for n in unknown)}; "
                         f"group by any of {', '.join(GROUPS)}", param="group_by")
    return list(dict.fromkeys(group_by))


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """What a usage question asks: rows with ``start <= at < end`` (None: unbounded), of one
    key, model or endpoint when given, grouped by ``group_by`` (checked names)."""

    group_by: tuple[str, ...] = ()
    start: float | None = None
    end: float | None = None
    key: str | None = None
    model: str | None = None
    endpoint: str | None = None

    def sql(self) -> tuple[str, list[Any]]:
        where, params = [], []
        if self.start is not None:
            where.append("at >= ?")
            params.append(self.start)
        if self.end is not None:
            where.append("at < ?")
            params.append(self.end)
        for column in ("key", "model", "endpoint"):
            value = getattr(self, column)
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        picked = [f"{GROUPS[name]} AS {name}" for name in self.group_by]
        sums = [f"COALESCE(SUM({name}), 0) AS {name}" for name in SUMMED]
        text = f"SELECT {', '.join([*picked, 'COUNT(*) AS requests', *sums])} FROM usage"
        if where:
            text += " WHERE " + " AND ".join(where)
        if self.group_by:
            positions = ", ".join(str(n + 1) for n in range(len(self.group_by)))
            text += f" GROUP BY {positions} ORDER BY {positions}"
        return text, params


def run_query(conn: sqlite3.Connection, query: UsageQuery) -> list[dict[str, Any]]:
    """The answer rows: the group columns, ``requests``, and every SUMMED figure (token and
    other counts as ints, the rest rounded to 6 places). Groups of no request are left out."""
    text, params = query.sql()
    names = [*query.group_by, "requests", *SUMMED]
    rows = []
    for values in conn.execute(text, params):
        row = dict(zip(names, values, strict=True))
        if not row["requests"]:
            continue  # no grouping and nothing matched: SQL's one row of empty sums
        for name in SUMMED:
            row[name] = int(row[name]) if name in INTEGER_COLUMNS else round(row[name], 6)
        rows.append(row)
    return rows
