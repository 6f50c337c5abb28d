"""``model-boss serve | ps | load | unload | pin | unpin | pull | rm | reload | config | leases |
simulate``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import httpx

from .errors import ConfigError
from .ps_table import render_ps
from .simulation import cli as simulate_cli


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .api.app import create_app
    from .settings import load_settings

    overrides = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    try:
        settings = load_settings(args.config, **overrides)
        app = create_app(settings)
    except ConfigError as exc:
        print(f"model-boss: configuration error: {exc.message}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvicorn's own lines (an access line per request among them) follow log_level too
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=logging.getLogger().level,
                timeout_graceful_shutdown=max(5, int(settings.stop_grace_s) + 5))
    return 0


def _url(args: argparse.Namespace) -> str:
    return args.url.rstrip("/")


def _headers() -> dict[str, str]:
    key = os.environ.get("MODEL_BOSS_ADMIN_API_KEY") or os.environ.get("MODEL_BOSS_API_KEY")
    return {"authorization": f"Bearer {key}"} if key else {}


def _call(method: str, args: argparse.Namespace, path: str, body: dict | None = None) -> int:
    try:
        response = httpx.request(method, _url(args) + path, json=body, headers=_headers(),
                                 timeout=args.timeout)
    except httpx.HTTPError as exc:
        print(f"model-boss: cannot reach {_url(args)}: {exc}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(response.json(), indent=2))
    except ValueError:
        print(response.text)
    return 0 if response.status_code < 400 else 1


def _ps_cluster(args: argparse.Namespace) -> int:
    from .cli_cluster import format_cluster

    try:
        data = httpx.get(_url(args) + "/api/v1/cluster", headers=_headers(), timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        print(f"model-boss: cannot reach {_url(args)}: {exc}", file=sys.stderr)
        return 1
    print(format_cluster(data))
    return 0


def _ps(args: argparse.Namespace) -> int:
    if args.cluster:
        return _ps_cluster(args)
    try:
        data = httpx.get(_url(args) + "/api/v1/status", headers=_headers(), timeout=10).json()
    except httpx.HTTPError as exc:
        print(f"model-boss: cannot reach {_url(args)}: {exc}", file=sys.stderr)
        return 1
    print(render_ps(data, time.time()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="model-boss")
    parser.add_argument("--url", default=os.environ.get("MODEL_BOSS_URL",
                                                        "http://127.0.0.1:8210"))
    parser.add_argument("--timeout", type=float, default=600.0)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", help="YAML settings file (or MODEL_BOSS_CONFIG)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    ps = sub.add_parser("ps", help="GPUs and slots of a running daemon")
    ps.add_argument("--cluster", action="store_true",
                    help="every member of its cluster and their models")
    ps.add_argument("--watch", action="store_true",
                    help="redraw on every event; loads show their stage")
    sub.add_parser("status", help="the full status document as JSON")
    for name in ("load", "unload", "pin", "unpin"):
        sub.add_parser(name, help=f"{name} a model").add_argument("model")
    sub.add_parser("pull", help="fetch a GGUF from the Hugging Face Hub into the models "
                   "folder: hf://ORG/REPO/FILE.gguf or hf://ORG/REPO:QUANT").add_argument(
        "source")
    sub.add_parser("rm", help="delete a discovered or pulled model's files").add_argument(
        "model")
    sub.add_parser("reload", help="read manifests, tasks and the models folder again")
    config = sub.add_parser("config", help="show or change runtime config")
    config.add_argument("assignments", nargs="*", help="key=value (true/false/numbers)")
    leases = sub.add_parser("leases", help="list, take or release GPU leases")
    leases.add_argument("action", nargs="?", choices=["list", "acquire", "release"],
                        default="list")
    leases.add_argument("--vram-mb", type=int)
    leases.add_argument("--gpu", type=int)
    leases.add_argument("--kind", default="external")
    leases.add_argument("--ttl-s", type=float)
    leases.add_argument("--id")
    simulate_cli.add_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "serve":
        return _serve(args)
    if args.command == "ps" and args.watch:
        from .ps_watch import watch

        return watch(args, _url(args), _headers(), _ps)
    if args.command == "ps":
        return _ps(args)
    if args.command == "status":
        return _call("GET", args, "/api/v1/status")
    if args.command == "simulate":
        return simulate_cli.run(args)
    if args.command in ("load", "unload", "pin", "unpin"):
        return _call("POST", args, f"/api/v1/models/{args.model}/{args.command}")
    if args.command == "pull":
        from .cli_pull import pull

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
                "ttl_s": args.ttl_s}
        return _call("POST", args, "/api/v1/leases", {k: v for k, v in body.items()
                                                      if v is not None})
    if args.action == "release":
        return _call("DELETE", args, f"/api/v1/leases/{args.id}")
    return _call("GET", args, "/api/v1/leases")


if __name__ == "__main__":
    sys.exit(main())
