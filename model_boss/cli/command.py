"""One way to declare a command: each module of this package has ``add_parser(sub)``, which
declares its commands with :func:`add_command`: the help, an example under it, and the
function that runs it, ``run(args, client) -> exit status``."""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable
from typing import Any

from .client import DaemonClient

Run = Callable[[argparse.Namespace, DaemonClient], int]
Subparsers = argparse._SubParsersAction


def add_command(sub: Subparsers, name: str, run: Run, *, summary: str,
                examples: tuple[str, ...], description: str | None = None,
                notes: str = "") -> argparse.ArgumentParser:
    """The parser of ``model-boss NAME``: ``summary`` in the commands' list (and, wrapped,
    as its description unless one is given), ``notes`` then ``examples`` under its help."""
    parser = sub.add_parser(
        name, help=summary, description=description or textwrap.fill(summary, 78),
        epilog=notes + "example:\n" + "\n".join(f"  {example}" for example in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    return parser


def print_json(document: Any) -> int:
    """What the admin calls print: the daemon's answer as indented JSON; exit status 0."""
    print(json.dumps(document, indent=2))
    return 0
