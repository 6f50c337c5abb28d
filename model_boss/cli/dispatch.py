"""``model-boss COMMAND``: the parser picks the command (each module's ``add_parser`` binds
its ``run``), and every command asks its daemon through one :class:`DaemonClient`; what goes
wrong there is one line on stderr and exit status 1."""

from __future__ import annotations

import gc
import os
import sys

import httpx

from .client import DaemonClient, DaemonError, admin_key, report
from .parser import build_parser


def main(argv: list[str] | None = None, *,
         transport: httpx.BaseTransport | None = None) -> int:
    """Run ``model-boss ARGV``; its exit status. ``transport`` carries the questions to the
    daemon (None: the network; a test's seam)."""
    gc.enable()  # ``python -m model_boss`` imports this module with it off
    args = build_parser().parse_args(argv)
    with DaemonClient(args.url, admin_key(os.environ), timeout=args.timeout,
                      transport=transport) as client:
        try:
            return args.run(args, client)
        except DaemonError as exc:
            return report(exc)


if __name__ == "__main__":
    sys.exit(main())
