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

from ..errors import error_text, network_reason

CLEAR = "\x1b[H\x1b[2J"
FINISHED = ("ready", "failed")


def watch(args: argparse.Namespace, url: str, headers: dict[str, str],
          draw_table: Callable[[argparse.Namespace], int]) -> int:
    """Draw, then redraw on every event until interrupted (Ctrl-C) or the server goes; a
    refusal or a lost connection is one line on stderr and exit status 1."""
    loads: dict[str, dict[str, Any]] = {}
    try:
        status = _get(url + "/api/v1/status", headers)
        for slot in status.get("slots", []):
            if slot.get("load_progress"):
                loads[slot["model"]] = {**slot["load_progress"], "at": time.time()}
        recent = _get(url + "/api/v1/events?stream=false", headers).get("events") or []
        since = recent[-1]["seq"] if recent else 0
        if _draw(args, loads, draw_table) != 0:
            return 1
        with httpx.stream("GET", f"{url}/api/v1/events?since={since}", headers=headers,
                          timeout=httpx.Timeout(10, read=None)) as stream:
            if stream.status_code >= 400:
                raise Refused(error_text(stream.read(), stream.status_code))
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "load_progress":
                    if event["stage"] in FINISHED:
                        loads.pop(event["model"], None)
                    else:
                        loads[event["model"]] = {**event, "at": time.time()}
                if _draw(args, loads, draw_table) != 0:
                    return 1
    except KeyboardInterrupt:
        return 0
    except Refused as exc:
        print(f"model-boss: {exc}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        print(f"model-boss: lost {url}: {network_reason(exc)}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError) as exc:
        print(f"model-boss: {url} sent an event this command cannot read "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    return 0


class Refused(Exception):
    """The daemon answered with an error: its message."""


def _get(url: str, headers: dict[str, str]) -> dict[str, Any]:
    response = httpx.get(url, headers=headers, timeout=10)
    if response.status_code >= 400:
        raise Refused(error_text(response.content, response.status_code))
    data = response.json()
    if not isinstance(data, dict):
        raise ValueError(f"{url} answered {type(data).__name__}, not an object")
    return data


def _draw(args: argparse.Namespace, loads: dict[str, dict[str, Any]],
          draw_table: Callable[[argparse.Namespace], int]) -> int:
    """The table and the loads under it; the table's exit status (not 0: it said why)."""
    if sys.stdout.isatty():
        print(CLEAR, end="")
    drawn = draw_table(args)
    if drawn != 0:
        return drawn
    for model, load in sorted(loads.items()):
        print(loading_line(model, load))
    print(time.strftime("updated %H:%M:%S (Ctrl-C to stop)"), flush=True)
    return 0


def loading_line(model: str, load: dict[str, Any]) -> str:
    """``LOADING smol stage=loading 45% 3.2s``: elapsed counts on from the event's (from
    when the server sent it, so a slow terminal does not add its own lag)."""
    fraction = f" {load['fraction']:.0%}" if load.get("fraction") is not None else ""
    elapsed = (load.get("elapsed_s") or 0.0) + max(0.0, time.time() - load.get("ts", load["at"]))
    return f"LOADING {model} stage={load['stage']}{fraction} {elapsed:.1f}s"
