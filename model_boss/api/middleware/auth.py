"""Pure ASGI middleware (no per-request task group): the last-resort error answer, API keys
and request metrics. The body limits are in :mod:`.limits`."""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...cluster import FORWARDED_HEADER, forward_refusal
from ...coordinator import Coordinator
from ...errors import BadRequest, Unauthorized
from ...services.clustered import FORWARDABLE
from ...tenancy.keys import CURRENT_IDENTITY, Identity, with_identity
from ..errors import envelope, error_response, internal_error
from ..ollama import ADMIN_PATHS, DATA_PATHS, is_ollama_path
from .keys import JOBS_PATH, KeyAdmission, as_key, check_key, given_key

log = logging.getLogger(__name__)

OPEN_PATHS = {"/health", "/metrics"}
# under /api/, yet any key may use them, on its own: its usage, its jobs
USER_API_PATHS = {"/api/v1/usage"}
USER_API_PREFIXES = ("/api/v1/jobs",)
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
    """Who a request is (its key: :mod:`.keys`), whether it may make it (admin routes need
    an admin key; an inference route, the key's kind of route, rates and quotas), and
    metrics for ``POST /v1/...`` and Ollama's chat, generate and embeddings."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator,
                 inference: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.coord = coordinator
        self.inference = inference | {JOBS_PATH}
        self.admission = KeyAdmission(coordinator.key_windows, coordinator.usage_spent)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        identity: Identity | None = None
        if FORWARDED_HEADER in headers:  # a forward from a cluster member, or a forgery
            refusal = forward_refusal(headers, self.coord.cluster.secret
                                      if self.coord.cluster else None)
            if refusal is None and scope["path"] not in FORWARDABLE:  # members send no other
                refusal = "forwards are taken on inference routes only"
            if refusal is not None:
                await envelope(refusal, 403, code="forward_refused")(scope, receive, send)
                return
        elif self.coord.keys.enforced and not _open(scope["path"]):
            path = scope["path"]
            keys = self.coord.keys
            # a key's own usage and jobs: with no user key, only an admin reads them
            checked = check_key(given_key(headers), keys, admin=_admin_path(path) or (
                not keys.users_enforced and _user_api_path(path)))
            if not checked.allowed:
                await error_response(checked.error or Unauthorized(
                    "missing or invalid API key"))(scope, receive, send)
                return
            record = checked.record
            if record is not None:
                scope_headers, end_user = as_key(list(scope["headers"]), record.name)
                if end_user == "":
                    await error_response(BadRequest(
                        "X-Client-Id: must not be empty (leave the header out)",
                        param="x_client_id", code="invalid_value"))(scope, receive, send)
                    return
                identity = Identity(record.name, record.admin, record, end_user)
                if scope["method"] == "POST" and path in self.inference:
                    refused = self.admission.admit(record, path)
                    if refused is not None:
                        self.coord.events.emit("key_refused", key=record.name,
                                              code=refused.code, path=path)
                        await error_response(refused)(scope, receive, send)
                        return
                scope = with_identity(dict(scope, headers=scope_headers), identity)
        token = CURRENT_IDENTITY.set(identity)
        try:
            await self._measured(scope, receive, send)
        finally:
            CURRENT_IDENTITY.reset(token)

    async def _measured(self, scope: Scope, receive: Receive, send: Send) -> None:
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


def _admin_path(path: str) -> bool:
    """The admin API: ``/api/*`` but Ollama's data routes, and a key's own usage and jobs."""
    return path.startswith("/api/") and not _user_api_path(path) and (
        not is_ollama_path(path) or path in ADMIN_PATHS)


def _user_api_path(path: str) -> bool:
    return path in USER_API_PATHS or path.startswith(USER_API_PREFIXES)


def _open(path: str) -> bool:
    """Paths that need no key: health, metrics and the dashboard's page and files."""
    return path in OPEN_PATHS or path == "/ui" or path.startswith(OPEN_PREFIXES)
