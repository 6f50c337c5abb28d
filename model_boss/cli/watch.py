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

from .client import (
    TABLE_TIMEOUT_S,
    DaemonClient,
    DaemonError,
    DaemonUnreachable,
    DaemonUnreadable,
)

CLEAR = "\x1b[H\x1b[2J"
FINISHED = ("ready", "failed")

DrawTable = Callable[[argparse.Namespace, DaemonClient], None]


def watch(args: argparse.Namespace, client: DaemonClient, draw_table: DrawTable) -> int:
    """Draw, then redraw on every event until interrupted (Ctrl-C, status 0) or the server
    goes; a refusal or a lost connection is a :class:`DaemonError`."""
    loads: dict[str, dict[str, Any]] = {}
    try:
        status = _document(client, "/api/v1/status")
        for slot in status.get("slots", []):
            if slot.get("load_progress"):
                loads[slot["model"]] = {**slot["load_progress"], "at": time.time()}
        recent = _document(client, "/api/v1/events?stream=false").get("events") or []
        since = recent[-1]["seq"] if recent else 0
        _draw(args, client, loads, draw_table)
        with client.stream("GET", f"/api/v1/events?since={since}",
                           timeout=httpx.Timeout(TABLE_TIMEOUT_S, read=None)) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "load_progress":
                    if event["stage"] in FINISHED:
                        loads.pop(event["model"], None)
                    else:
                        loads[event["model"]] = {**event, "at": time.time()}
                _draw(args, client, loads, draw_table)
    except KeyboardInterrupt:
        return 0
    except DaemonUnreachable as exc:
        raise DaemonError(f"lost {exc.url}: {exc.reason}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise DaemonUnreadable(f"{client.url} sent an event this command cannot read "
                               f"({type(exc).__name__}: {exc})") from exc
    return 0


def _document(client: DaemonClient, path: str) -> dict[str, Any]:
    data = client.get(path, timeout=TABLE_TIMEOUT_S)
    if not isinstance(data, dict):
        raise ValueError(f"{client.url}{path} answered {type(data).__name__}, not an object")
    return data


def _draw(args: argparse.Namespace, client: DaemonClient, loads: dict[str, dict[str, Any]],
          draw_table: DrawTable) -> None:
    """The table and the loads under it."""
    if sys.stdout.isatty():
        print(CLEAR, end="")
    draw_table(args, client)
    for model, load in sorted(loads.items()):
        print(loading_line(model, load))
    print(time.strftime("updated %H:%M:%S (Ctrl-C to stop)"), flush=True)


def loading_line(model: str, load: dict[str, Any]) -> str:
    """``LOADING smol stage=loading 45% 3.2s``: elapsed counts on from the event's (from
    when the server sent it, so a slow terminal does not add its own lag)."""
    fraction = f" {load['fraction']:.0%}" if load.get("fraction") is not None else ""
    elapsed = (load.get("elapsed_s") or 0.0) + max(0.0, time.time() - load.get("ts", load["at"]))
    return f"LOADING {model} stage={load['stage']}{fraction} {elapsed:.1f}s"
