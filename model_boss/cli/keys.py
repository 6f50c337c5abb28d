"""``model-boss keys create|list|update|rotate|revoke``: the key API from the command line
(``/api/v1/keys``, an admin key in ``MODEL_BOSS_ADMIN_API_KEY``). ``create`` and ``rotate``
print the secret alone on their last line, so a script can take it with ``tail -1``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..settings import END_USER_LIMITS, LIMITS
from .client import DaemonClient
from .command import Subparsers, add_command
from .table import columns, exact_figure

EXAMPLES = ("model-boss keys create alice --models 'qwen*' --tokens-per-day 2000000",
            "model-boss keys revoke alice")


def add_parser(sub: Subparsers) -> None:
    parser = add_command(
        sub, "keys", run, summary="create, list, change, rotate or revoke API keys",
        description="API keys as tenants: each has a scope (models, kinds of route), limits "
                    "(rates, quotas) and an expiry. The secret is shown once.",
        examples=EXAMPLES)
    parser.add_argument("action", choices=["create", "list", "update", "rotate", "revoke"])
    parser.add_argument("name", nargs="?", help="the key's name (all but list)")
    parser.add_argument("--models", help="comma-separated names or globs it may use "
                        "('qwen*'); '' for none; leave out for every model")
    parser.add_argument("--endpoints", help="comma-separated kinds it may call: chat, "
                                            "embeddings, images, video, audio, rerank, realtime")
    parser.add_argument("--admin", action=argparse.BooleanOptionalAction, default=None,
                        help="it may use the admin API")
    parser.add_argument("--expires-at", help="ISO 8601 (UTC without a zone); 'never' clears")
    # the limit flags: --NAME-WITH-DASHES → the API's field, and its type (settings.LIMITS)
    for name, kind in LIMITS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=_limit(kind), metavar="N",
                            default=argparse.SUPPRESS, help="'none' clears it")
    # each end user's under the key (settings.END_USER_LIMITS): --end-user-NAME
    for name, kind in END_USER_LIMITS.items():
        parser.add_argument("--end-user-" + name.replace("_", "-"), type=_limit(kind),
                            metavar="N", dest=END_USER_FLAG + name, default=argparse.SUPPRESS,
                            help="each end user's under the key; the end user flags given "
                                 "replace the key's end_user_limits")


END_USER_FLAG = "end_user_"  # the namespace's prefix for the end user limit flags


def _limit(kind: type) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "null", "off") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def terms(args: argparse.Namespace) -> dict[str, Any]:
    """The fields the flags given say (a flag left out changes nothing)."""
    body: dict[str, Any] = {}
    if args.models is not None:
        body["models"] = [m for m in args.models.split(",") if m]
    if args.endpoints is not None:
        body["endpoints"] = [e for e in args.endpoints.split(",") if e]
    if args.admin is not None:
        body["admin"] = args.admin
    if args.expires_at is not None:
        body["expires_at"] = None if args.expires_at == "never" else args.expires_at
    for name in LIMITS:  # given only when its flag was (``none`` clears it)
        if hasattr(args, name):
            body[name] = getattr(args, name)
    end_user = {name: getattr(args, END_USER_FLAG + name) for name in END_USER_LIMITS
                if hasattr(args, END_USER_FLAG + name)}
    if end_user:  # the API replaces them whole; the ones left out are cleared
        body["end_user_limits"] = {k: v for k, v in end_user.items() if v is not None} or None
    return body


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    if args.action != "list" and not args.name:
        print(f"model-boss: keys {args.action} needs a key name", file=sys.stderr)
        return 2
    calls = {"create": ("POST", "/api/v1/keys", {"name": args.name, **terms(args)}),
             "list": ("GET", "/api/v1/keys", None),
             "update": ("PATCH", f"/api/v1/keys/{args.name}", terms(args)),
             "rotate": ("POST", f"/api/v1/keys/{args.name}/rotate", None),
             "revoke": ("DELETE", f"/api/v1/keys/{args.name}", None)}
    method, path, body = calls[args.action]
    data = client.request(method, path, body)
    if args.action == "list":
        print(client.readable(lambda listed: format_keys(listed.get("keys", [])), data))
        return 0
    print(client.readable(lambda key: format_keys([key]), data))
    if data.get("key"):  # the secret, alone on the last line: shown this once
        print(f"the key's secret (shown once, store it now):\n{data['key']}")
    return 0


def format_keys(keys: list[dict[str, Any]]) -> str:
    """One line a key: name, prefix, scope, limits, expiry or revocation."""
    rows = [["NAME", "PREFIX", "ADMIN", "MODELS", "ENDPOINTS", "LIMITS", "EXPIRES", "REVOKED"]]
    for key in keys:
        end_user = key.get("end_user_limits") or {}
        limits = ", ".join([f"{name}={exact_figure(key[name])}" for name in LIMITS
                            if key.get(name) is not None]
                           + [f"end_user.{name}={exact_figure(end_user[name])}"
                              for name in END_USER_LIMITS if end_user.get(name) is not None])
        row = [key["name"], key.get("prefix") or "-", "yes" if key.get("admin") else "no",
               (",".join(key["models"]) or "(none)") if key.get("models") is not None else "*",
               ",".join(key["endpoints"]) if key.get("endpoints") is not None else "*",
               limits or "-", key.get("expires_at") or "-", key.get("revoked_at") or "-"]
        rows.append([str(cell) for cell in row])
    return "\n".join(columns(rows))
