"""The cells and columns of the command line's tables (``keys``, ``usage``): figures written
one way each, columns as wide as their widest cell."""

from __future__ import annotations

from typing import Any


def columns(rows: list[list[str]], right_from: int | None = None) -> list[str]:
    """Each row as a line, cells two spaces apart and as wide as their column's widest;
    cells from column ``right_from`` on are aligned right (figures), the rest left."""
    widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]))]
    right = len(widths) if right_from is None else right_from
    return ["  ".join(cell.rjust(width) if n >= right else cell.ljust(width)
                      for n, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def exact_figure(value: float) -> str:
    """A figure as a flag takes it back: 2000000 as 2000000 (not 2e+06), 0.5 as 0.5."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def summed_figure(value: Any) -> str:
    """A sum as a person reads it: 1,200 requests, 12.50 or 240.0 seconds."""
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 100 else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
