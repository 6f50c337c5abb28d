"""``model-boss config [KEY=VALUE ...]``: show the daemon's runtime config, or change some of
it (``/api/v1/config``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .client import DaemonClient
from .command import Subparsers, add_command, print_json


def add_parser(sub: Subparsers) -> None:
    parser = add_command(sub, "config", run, summary="show or change runtime config",
                         examples=("model-boss config allowCloudFallback=false",))
    parser.add_argument("assignments", nargs="*", help="key=value (true/false/numbers)")


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    if not args.assignments:
        return print_json(client.get("/api/v1/config"))
    return print_json(client.put("/api/v1/config", changes(args.assignments)))


def changes(assignments: list[str]) -> dict[str, Any]:
    """``key=value`` pairs as the body: true, false and numbers as JSON, the rest as text."""
    body: dict[str, Any] = {}
    for item in assignments:
        key, _, value = item.partition("=")
        body[key] = json.loads(value) if value in ("true", "false") or \
            value.replace(".", "", 1).isdigit() else value
    return body
