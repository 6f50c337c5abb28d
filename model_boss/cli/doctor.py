"""``model-boss doctor``: what this install can run, one line per kind of model (the extra it
needs, and the command that adds it where it is missing), then the models the daemon lists as
unavailable and why, when one answers."""

from __future__ import annotations

import argparse

from ..catalog.extras import KindReadiness, module_found, readiness
from .client import DaemonClient, DaemonError
from .command import Subparsers, add_command
from .table import columns

DAEMON_TIMEOUT_S = 5.0


def add_parser(sub: Subparsers) -> None:
    add_command(sub, "doctor", run,
                summary="what this install can run, by kind of model, and what to install",
                examples=("model-boss doctor",))


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    print(format_readiness(readiness(module_found)))
    print()
    print(daemon_lines(client))
    return 0


def format_readiness(kinds: list[KindReadiness]) -> str:
    """The kinds as a table: the kind, its extra, and ready or what is missing with the
    command that installs it."""
    rows = [["KIND", "EXTRA", "THIS INSTALL"]]
    for kind in kinds:
        if kind.needed is None:
            rows.append([kind.kind, "-", "ready (nothing to install)"])
        elif kind.ready:
            rows.append([kind.kind, kind.needed.extra, "ready"])
        else:
            missing = ", ".join(kind.missing)
            rows.append([kind.kind, kind.needed.extra,
                         f"missing {missing}: {kind.needed.command}"])
    return "\n".join(columns(rows))


def daemon_lines(client: DaemonClient) -> str:
    """The models the daemon at ``client`` lists as unavailable, one line each with why; or
    that all it lists are available; or why it could not be asked."""
    try:
        document = client.get("/v1/models", timeout=DAEMON_TIMEOUT_S)
    except DaemonError as exc:
        return f"the daemon: {exc} (the kinds above are this install's own; a daemon that " \
               "runs lists each model it cannot serve and why)"
    listed = document.get("data") if isinstance(document, dict) else None
    if not isinstance(listed, list) or not all(isinstance(e, dict) for e in listed):
        return f"the daemon at {client.url} answered a model list this command cannot read"
    unavailable = [(entry.get("id", "?"), entry.get("unavailable_reason") or "unavailable")
                   for entry in listed if entry.get("available") is False]
    if not unavailable:
        return f"the daemon at {client.url}: all {len(listed)} of its models can be served"
    lines = [f"the daemon at {client.url}: {len(unavailable)} of its {len(listed)} models "
             "cannot be served now:"]
    lines += [f"  {model}: {reason}" for model, reason in unavailable]
    return "\n".join(lines)
