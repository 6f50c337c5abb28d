"""Usage answers as CSV, for spreadsheets and billing scripts."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any


def rows_to_csv(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """``rows`` as CSV text, a header row first. ``columns`` (default: the first row's keys)
    orders the columns and gives the header when there are no rows."""
    names = list(columns) if columns is not None else list(rows[0]) if rows else []
    if not names:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore", lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
