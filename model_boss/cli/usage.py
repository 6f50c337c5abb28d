"""``model-boss usage``: what each key used, grouped and summed by the daemon, as a table or
CSV (``GET /api/v1/usage``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .client import DaemonClient
from .command import Subparsers, add_command
from .table import columns, summed_figure

EXAMPLE = "model-boss usage --group-by key,day --from 2025-05-01 --to 2025-05-31"

# figures shown whatever their values; the other sums show when some row has one
ALWAYS = ("requests", "prompt_tokens", "completion_tokens", "gpu_seconds")
HEADINGS = {"requests": "REQUESTS", "prompt_tokens": "PROMPT", "completion_tokens": "COMPLETION",
            "cached_tokens": "CACHED", "images": "IMAGES", "steps": "STEPS",
            "audio_seconds": "AUDIO_S", "gpu_seconds": "GPU_S",
            "vram_mb_seconds": "VRAM_MB_S", "load_seconds": "LOAD_S",
            "queue_wait_s": "WAIT_S", "duration_s": "TIME_S"}


def add_parser(sub: Subparsers) -> None:
    parser = add_command(sub, "usage", run,
                         summary="what each key used: requests, tokens, GPU-seconds",
                         description="What each key used (the daemon's usage ledger), "
                                     "grouped and summed. Times are UTC.",
                         examples=(EXAMPLE,))
    parser.add_argument("--group-by", default="key,model",
                        help="comma-separated: key, end_user, model, endpoint, outcome, day, "
                             "hour, member (default key,model)")
    parser.add_argument("--from", dest="start", metavar="WHEN",
                        help="ISO 8601 date or datetime (default: today's start, UTC)")
    parser.add_argument("--to", dest="end", metavar="WHEN",
                        help="ISO 8601, exclusive; a bare date takes in that day (default: now)")
    parser.add_argument("--key", help="only this key's rows")
    parser.add_argument("--model", help="only this model's rows")
    parser.add_argument("--endpoint", help="only this endpoint's rows")
    parser.add_argument("--csv", action="store_true", help="CSV instead of a table")


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    """Ask the daemon and print its answer: a table, or the daemon's own CSV."""
    asked = {"group_by": args.group_by, "from": args.start, "to": args.end, "key": args.key,
             "model": args.model, "endpoint": args.endpoint,
             "format": "csv" if args.csv else "json"}
    params = {name: value for name, value in asked.items() if value is not None}
    if args.csv:
        sys.stdout.write(client.text("/api/v1/usage", params=params))
        return 0
    print(client.readable(format_usage, client.get("/api/v1/usage", params=params)))
    return 0


def format_usage(data: dict[str, Any]) -> str:
    """The JSON answer of ``GET /api/v1/usage`` as an aligned table with its period above."""
    groups: list[str] = data.get("group_by", [])
    rows: list[dict[str, Any]] = data.get("rows", [])
    period = f"from {data.get('from')} to {data.get('to')}"
    if not rows:
        return f"{period}\n(no requests)"
    figures = [name for name in HEADINGS
               if name in ALWAYS or any(row.get(name) for row in rows)]
    table = [[name.upper() for name in groups] + [HEADINGS[name] for name in figures]]
    for row in rows:
        table.append([str(row.get(name) or "-") for name in groups]
                     + [summed_figure(row.get(name, 0)) for name in figures])
    return "\n".join([period, *columns(table, right_from=len(groups))])

