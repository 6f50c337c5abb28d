"""``model-boss leases [list | acquire | release]``: the daemon's GPU leases, and VRAM taken
or given back for work it does not run (``/api/v1/leases``)."""

from __future__ import annotations

import argparse

from .client import DaemonClient
from .command import Subparsers, add_command, print_json


def add_parser(sub: Subparsers) -> None:
    parser = add_command(sub, "leases", run, summary="list, take or release GPU leases",
                         examples=("model-boss leases acquire --vram-mb 4000 --kind training "
                                   "--ttl-s 600 --holder trainer-7",))
    parser.add_argument("action", nargs="?", choices=["list", "acquire", "release"],
                        default="list")
    parser.add_argument("--vram-mb", type=int)
    parser.add_argument("--gpu", type=int)
    parser.add_argument("--kind", default="external")
    parser.add_argument("--ttl-s", type=float)
    parser.add_argument("--holder", help="who holds it (listed by ps and the dashboard)")
    parser.add_argument("--note", help="what it is for")
    parser.add_argument("--id", help="the lease to release (`model-boss ps` lists them)")


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    if args.action == "acquire":
        asked = {"vram_mb": args.vram_mb, "gpu": args.gpu, "kind": args.kind,
                 "ttl_s": args.ttl_s, "holder": args.holder, "note": args.note}
        return print_json(client.post("/api/v1/leases", {name: value for name, value
                                                         in asked.items() if value is not None}))
    if args.action == "release":
        return print_json(client.delete(f"/api/v1/leases/{args.id}"))
    return print_json(client.get("/api/v1/leases"))
