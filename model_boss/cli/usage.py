"""``model-boss usage``: what each key used, grouped and summed by the daemon, as a table or
CSV (``GET /api/v1/usage``). Imported by the command line only (it needs httpx, which the
ledger does not)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx

from ..errors import error_text, network_reason

EXAMPLE = "model-boss usage --group-by key,day --from 2025-05-01 --to 2025-05-31"

# figures shown whatever their values; the other sums show when some row has one
ALWAYS = ("requests", "prompt_tokens", "completion_tokens", "gpu_seconds")
HEADINGS = {"requests": "REQUESTS", "prompt_tokens": "PROMPT", "completion_tokens": "COMPLETION",
            "cached_tokens": "CACHED", "images": "IMAGES", "steps": "STEPS",
            "audio_seconds": "AUDIO_S", "gpu_seconds": "GPU_S",
            "vram_mb_seconds": "VRAM_MB_S", "load_seconds": "LOAD_S",
            "queue_wait_s": "WAIT_S", "duration_s": "TIME_S"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("usage", help="what each key used: requests, tokens, GPU-seconds",
                            description="What each key used (the daemon's usage ledger), "
                                        "grouped and summed. Times are UTC.",
                            epilog=f"example:\n  {EXAMPLE}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
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


def run(args: argparse.Namespace, url: str, headers: dict[str, str]) -> int:
    """Ask the daemon at ``url`` and print its answer; 1 (and one line on stderr) when it
    cannot be reached or refuses."""
    params = {"group_by": args.group_by, "from": args.start, "to": args.end, "key": args.key,
              "model": args.model, "endpoint": args.endpoint,
              "format": "csv" if args.csv else "json"}
    try:
        response = httpx.get(url + "/api/v1/usage", headers=headers,
                             params={k: v for k, v in params.items() if v is not None},
                             timeout=getattr(args, "timeout", 60.0))
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        print(f"model-boss: cannot reach {url}: {network_reason(exc)}", file=sys.stderr)
        return 1
    if response.status_code >= 400:
        print(f"model-boss: {error_text(response.content, response.status_code)}",
              file=sys.stderr)
        return 1
    if args.csv:
        sys.stdout.write(response.text)
        return 0
    try:
        data = response.json()
    except ValueError:
        print(f"model-boss: {url} answered something other than JSON", file=sys.stderr)
        return 1
    print(format_usage(data))
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
                     + [_figure(row.get(name, 0)) for name in figures])
    widths = [max(len(line[n]) for line in table) for n in range(len(table[0]))]
    lines = [period]
    for line in table:
        cells = [cell.ljust(width) if n < len(groups) else cell.rjust(width)
                 for n, (cell, width) in enumerate(zip(line, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 100 else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)

