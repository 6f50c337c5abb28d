"""Who may reach the API: a request is served only when its ``Host`` is one of this
coordinator's own names, and its ``Origin`` (when a browser page sent one) is a page allowed
to call it. A page on a foreign site then cannot drive the API through the browser of someone
on this machine or its network: not by DNS rebinding (its own name pointed at this address:
the ``Host`` stays that name), and not by a form or ``text/plain`` POST, which a browser sends
without a CORS preflight (its ``Origin`` is the foreign page's). The decisions are the pure
:func:`host_allowed` and :func:`origin_allowed`; :class:`HostGuard` refuses with 403 before
anything reads the body."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from ...coordinator import Coordinator
from ...settings import Settings
from ..errors import envelope
from .cors import origin_pattern

# a websocket refused before its accept: the server answers the handshake with 403
POLICY_VIOLATION = 1008


@dataclass(frozen=True)
class OwnNames:
    """The names a request's ``Host`` may carry, IP literals aside (always allowed: a page
    cannot rebind a literal address): exact names, ``.suffix`` patterns (``*.example.org``),
    or any name at all (``*``)."""

    exact: frozenset[str]
    suffixes: tuple[str, ...] = (".localhost",)
    any_name: bool = False


@dataclass(frozen=True)
class PageOrigins:
    """The browser pages ``cors_origins`` lets call the API: one pattern, or any page."""

    pattern: re.Pattern[str] | None
    any_origin: bool = False


def own_names(settings: Settings, hostname: str) -> OwnNames:
    """This coordinator's names: ``localhost`` (and ``*.localhost``), the machine's
    ``hostname`` (and its first label), the address it listens on, the host of its
    ``advertise_url`` (the one cluster members forward to), and ``allowed_hosts``."""
    names = {"localhost", hostname, hostname.partition(".")[0], settings.host,
             urlsplit(settings.advertise_url).hostname or ""}
    suffixes = [".localhost"]
    for entry in settings.allowed_hosts:
        if entry.startswith("*."):
            suffixes.append(entry[1:])
        else:
            names.add(entry)
    return OwnNames(frozenset(host_name(name) for name in names if name) - {""},
                    tuple(suffixes), any_name="*" in settings.allowed_hosts)


def page_origins(origins: Sequence[str]) -> PageOrigins:
    """The pages ``origins`` (``cors_origins``) allows, matched as the CORS middleware
    matches them (:func:`~.cors.origin_pattern`)."""
    if "*" in origins:
        return PageOrigins(None, any_origin=True)
    pattern = origin_pattern(origins)
    return PageOrigins(re.compile(pattern) if pattern else None)


def host_name(host: str) -> str:
    """The name in a ``Host`` header: lower case, its port cut off, an IPv6 literal's
    brackets taken away, without a final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def host_allowed(host: str, names: OwnNames) -> bool:
    """Whether a request whose ``Host`` header is ``host`` is for this coordinator."""
    name = host_name(host)
    if names.any_name or name in names.exact or name.endswith(names.suffixes):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_allowed(origin: str, host: str | None, pages: PageOrigins) -> bool:
    """Whether the page at ``origin`` may call the API: one ``cors_origins`` allows, or the
    request's own origin (its ``host:port`` is the ``Host``: the dashboard served from a LAN
    address calls itself). ``null`` (a sandboxed page, a file) only when any page may."""
    if pages.any_origin:
        return True
    if origin == "null":
        return False
    if pages.pattern is not None and pages.pattern.fullmatch(origin):
        return True
    scheme, separator, authority = origin.lower().partition("://")
    return (bool(separator) and scheme in ("http", "https") and host is not None
            and authority == host.strip().lower())


class HostGuard:
    """Refuses, with 403 in the route's envelope, a request whose ``Host`` is not one of the
    coordinator's names (``host_not_allowed``) or whose ``Origin`` is a page that may not
    call the API (``origin_not_allowed``); a websocket is closed before its accept. A request
    without a ``Host`` (HTTP/1.0) or an ``Origin`` (not from a page) is not refused for it."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        settings = coordinator.settings
        self.names = own_names(settings, socket.gethostname())
        self.pages = page_origins(settings.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await WebSocketClose(POLICY_VIOLATION, refusal[0])(scope, receive, send)
        else:
            message, code = refusal
            await envelope(message, 403, code=code)(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[str, str] | None:
        """Why this request is refused (message, code); None when it may pass."""
        host = origin = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        if host and not host_allowed(host, self.names):
            return (f"host {host_name(host)!r} is not one of this server's names; "
                    "allowed_hosts lists others it answers to", "host_not_allowed")
        if origin is not None and not origin_allowed(origin, host, self.pages):
            return (f"origin {origin!r} may not call this API; cors_origins lists the "
                    "pages that may", "origin_not_allowed")
        return None
