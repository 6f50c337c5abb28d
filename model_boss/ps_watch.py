"""``model-boss ps --watch``: the ps table again on every event, with loads in flight under it.

It follows ``GET /api/v1/events`` (one connection, no polling) and redraws on each event; a
``load_progress`` event updates the LOADING lines at once (stage, fraction, elapsed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

CLEAR = "\x1b[H\x1b[2J"
FINISHED = ("ready", "failed")


def watch(args: argparse.Namespace, url: str, headers: dict[str, str],
          draw_table: Callable[[argparse.Namespace], int]) -> int:
    """Draw, then redraw on every event until interrupted (Ctrl-C) or the server goes."""
    loads: dict[str, dict[str, Any]] = {}
    try:
        status = httpx.get(url + "/api/v1/status", headers=headers, timeout=10).json()
        for slot in status.get("slots", []):
            if slot.get("load_progress"):
                loads[slot["model"]] = {**slot["load_progress"], "at": time.time()}
        recent = httpx.get(url + "/api/v1/events?stream=false", headers=headers,
                           timeout=10).json()["events"]
        since = recent[-1]["seq"] if recent else 0
        _draw(args, loads, draw_table)
        with httpx.stream("GET", f"{url}/api/v1/events?since={since}", headers=headers,
                          timeout=httpx.Timeout(10, read=None)) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "load_progress":
                    if event["stage"] in FINISHED:
                        loads.pop(event["model"], None)
                    else:
                        loads[event["model"]] = {**event, "at": time.time()}
                _draw(args, loads, draw_table)
    except KeyboardInterrupt:
        return 0
    except httpx.HTTPError as exc:
        print(f"model-boss: lost {url}: {exc}", file=sys.stderr)
        return 1
    return 0


def _draw(args: argparse.Namespace, loads: dict[str, dict[str, Any]],
          draw_table: Callable[[argparse.Namespace], int]) -> None:
    if sys.stdout.isatty():
        print(CLEAR, end="")
    draw_table(args)
    for model, load in sorted(loads.items()):
        print(loading_line(model, load))
    print(time.strftime("updated %H:%M:%S (Ctrl-C to stop)"), flush=True)


def loading_line(model: str, load: dict[str, Any]) -> str:
    """``LOADING smol stage=loading 45% 3.2s``: elapsed counts on from the event's (from
    when the server sent it, so a slow terminal does not add its own lag)."""
    fraction = f" {load['fraction']:.0%}" if load.get("fraction") is not None else ""
    elapsed = (load.get("elapsed_s") or 0.0) + max(0.0, time.time() - load.get("ts", load["at"]))
    return f"LOADING {model} stage={load['stage']}{fraction} {elapsed:.1f}s"
