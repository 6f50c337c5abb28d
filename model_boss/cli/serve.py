"""``model-boss serve``: run the daemon (:mod:`model_boss.daemon.start` starts and serves it)."""

from __future__ import annotations

import argparse

from .client import DaemonClient
from .command import Subparsers, add_command


def add_parser(sub: Subparsers) -> None:
    parser = add_command(sub, "serve", run, summary="run the daemon",
                         examples=("model-boss serve --config /etc/model-boss.yaml "
                                   "--port 8210",))
    parser.add_argument("--config", help="YAML settings file (or MODEL_BOSS_CONFIG)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int, help="(or MODEL_BOSS_PORT)")


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    """Serve until a signal has drained the daemon (it is the daemon: ``client`` unused)."""
    from ..daemon.start import start

    return start(args.config, host=args.host, port=args.port)
