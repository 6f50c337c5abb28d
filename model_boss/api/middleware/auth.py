"""Pure ASGI middleware (no per-request task group): the last-resort error answer, API keys
and request metrics. The body limits are in :mod:`.limits`."""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...cluster import FORWARDED_HEADER, forward_refusal
from ...coordinator import Coordinator
from ...services.clustered import FORWARDABLE
from ..errors import envelope, internal_error
from ..ollama import ADMIN_PATHS, DATA_PATHS, is_ollama_path
from .keys import check_key, given_key, with_client

log = logging.getLogger(__name__)

OPEN_PATHS = {"/health", "/metrics"}
# The dashboard's static files: no state, no secret; the page asks for a key when the API does.
OPEN_PREFIXES = ("/ui/",)


class InternalErrors:
    """Answers an unexpected exception with a 500 envelope and does not re-raise it, so the
    server keeps the keep-alive connection (uvicorn closes it when an app raises)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:  # half a response cannot be mended; the server ends the connection
                raise
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            await internal_error(exc)(scope, receive, send)


class AuthAndMetrics:
    """API keys (``admin_api_key`` for ``/api/``, Ollama's routes aside), and metrics for
    ``POST /v1/...`` and Ollama's chat, generate and embeddings."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.coord.settings
        headers = Headers(scope=scope)
        if FORWARDED_HEADER in headers:  # a forward from a cluster member, or a forgery
            refusal = forward_refusal(headers, self.coord.cluster.secret
                                      if self.coord.cluster else None)
            if refusal is None and scope["path"] not in FORWARDABLE:  # members send no other
                refusal = "forwards are taken on inference routes only"
            if refusal is not None:
                await envelope(refusal, 403, code="forward_refused")(scope, receive, send)
                return
        elif (settings.user_keys_set or settings.admin_api_key) and not _open(scope["path"]):
            path = scope["path"]
            checked = check_key(given_key(headers), settings,
                                admin=path.startswith("/api/") and (
                                    not is_ollama_path(path) or path in ADMIN_PATHS))
            if not checked.allowed:
                await envelope("missing or invalid API key", 401, code="invalid_api_key")(
                    scope, receive, send)
                return
            if checked.client is not None:  # a named key is its client unless one is named
                scope = dict(scope, headers=with_client(list(scope["headers"]), checked.client))
        path = scope["path"]
        if not ((path.startswith("/v1/") or path in DATA_PATHS) and scope["method"] == "POST"):
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        seen: dict[str, object] = {}

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for key, value in message.get("headers", []):
                    if key == b"x-model-boss-model":
                        seen["model"] = value.decode()
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            if "status" in seen:
                self.coord.metrics.observe_request(str(seen.get("model", "-")), path,
                                                   int(seen["status"]),
                                                   time.monotonic() - started)


def _open(path: str) -> bool:
    """Paths that need no key: health, metrics and the dashboard's page and files."""
    return path in OPEN_PATHS or path == "/ui" or path.startswith(OPEN_PREFIXES)
