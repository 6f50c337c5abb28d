"""``model-boss serve | ps | status | load | unload | pin | unpin | pull | rm | reload | config |
leases | keys | usage | launch | simulate``: what each command does (the parser, its help and
examples: parser.py)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any

import httpx

from ..errors import error_text, network_reason
from . import simulate as simulate_cli
from .parser import build_parser
from .ps import render_ps


def _serve(args: argparse.Namespace) -> int:
    from ..daemon.start import start

    return start(args.config, host=args.host, port=args.port)


def _url(args: argparse.Namespace) -> str:
    return args.url.rstrip("/")


def _headers() -> dict[str, str]:
    key = os.environ.get("MODEL_BOSS_ADMIN_API_KEY") or os.environ.get("MODEL_BOSS_API_KEY")
    return {"authorization": f"Bearer {key}"} if key else {}


def _ask(method: str, args: argparse.Namespace, path: str, body: dict | None = None,
         timeout: float | None = None) -> Any:
    """The daemon's JSON answer; None (after one line on stderr) when it cannot be reached,
    refuses, or answers something other than JSON."""
    try:
        response = httpx.request(method, _url(args) + path, json=body, headers=_headers(),
                                 timeout=args.timeout if timeout is None else timeout)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        print(f"model-boss: cannot reach {_url(args)}: {network_reason(exc)}", file=sys.stderr)
        return None
    if response.status_code >= 400:
        print(f"model-boss: {error_text(response.content, response.status_code)}",
              file=sys.stderr)
        return None
    try:
        return response.json()
    except ValueError:
        print(f"model-boss: {_url(args)}{path} answered something other than JSON "
              f"(HTTP {response.status_code}): {error_text(response.content)[:200]}",
              file=sys.stderr)
        return None


def _call(method: str, args: argparse.Namespace, path: str, body: dict | None = None) -> int:
    data = _ask(method, args, path, body)
    if data is None:
        return 1
    print(json.dumps(data, indent=2))
    return 0


def _unreadable(args: argparse.Namespace, exc: Exception) -> int:
    """A daemon answered 200 with a document this CLI cannot draw (another version)."""
    print(f"model-boss: {_url(args)} answered a document this command cannot read "
          f"({type(exc).__name__}: {exc}); is it a model-boss daemon of this version?",
          file=sys.stderr)
    return 1


def _ps_cluster(args: argparse.Namespace) -> int:
    from .cluster import format_cluster

    data = _ask("GET", args, "/api/v1/cluster", timeout=10)
    if data is None:
        return 1
    try:
        print(format_cluster(data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return _unreadable(args, exc)
    return 0


def _ps(args: argparse.Namespace) -> int:
    if args.cluster:
        return _ps_cluster(args)
    data = _ask("GET", args, "/api/v1/status", timeout=10)
    if data is None:
        return 1
    try:
        # the server's clock: countdowns (UNTIL, lease expiry) read right from another host
        print(render_ps(data, data.get("time", time.time())))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return _unreadable(args, exc)
    return 0


def main(argv: list[str] | None = None) -> int:
    gc.enable()  # ``python -m model_boss`` imports this module with it off
    args = build_parser().parse_args(argv)

    if args.command == "serve":
        return _serve(args)
    if args.command == "ps" and args.watch:
        from .watch import watch

        return watch(args, _url(args), _headers(), _ps)
    if args.command == "ps":
        return _ps(args)
    if args.command == "status":
        return _call("GET", args, "/api/v1/status")
    if args.command == "simulate":
        return simulate_cli.run(args)
    if args.command in ("keys", "usage"):
        from . import keys as keys_cli
        from . import usage as usage_cli

        return (keys_cli if args.command == "keys" else usage_cli).run(args, _url(args),
                                                                        _headers())
    if args.command == "launch":
        from . import launch as launch_cli

        return launch_cli.run(args, _url(args))
    if args.command in ("load", "unload", "pin", "unpin"):
        return _call("POST", args, f"/api/v1/models/{args.model}/{args.command}")
    if args.command == "pull":
        from .pull import pull

        return pull(_url(args), _headers(), args.source, args.timeout)
    if args.command == "rm":
        return _call("DELETE", args, f"/api/v1/models/{args.model}")
    if args.command == "reload":
        return _call("POST", args, "/api/v1/reload")
    if args.command == "config":
        if not args.assignments:
            return _call("GET", args, "/api/v1/config")
        body = {}
        for item in args.assignments:
            key, _, value = item.partition("=")
            body[key] = json.loads(value) if value in ("true", "false") or \
                value.replace(".", "", 1).isdigit() else value
        return _call("PUT", args, "/api/v1/config", body)
    if args.action == "acquire":
        body = {"vram_mb": args.vram_mb, "gpu": args.gpu, "kind": args.kind,
                "ttl_s": args.ttl_s, "holder": args.holder, "note": args.note}
        return _call("POST", args, "/api/v1/leases", {k: v for k, v in body.items()
                                                      if v is not None})
    if args.action == "release":
        return _call("DELETE", args, f"/api/v1/leases/{args.id}")
    return _call("GET", args, "/api/v1/leases")


if __name__ == "__main__":
    sys.exit(main())
