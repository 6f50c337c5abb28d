"""Identify: the edge decides who a request is, once, and leaves it on the request
(:func:`~model_boss.tenancy.keys.with_identity`; read back with
:func:`~model_boss.tenancy.keys.identity_of`). With keys configured, a route that needs one is
refused without a good key (admin routes need an admin's); the key, with the client id the
request named as its end user, is the identity. An open path is never refused for a key, but
a good one is its identity (``/health`` names the models only to a key), and ``/metrics``
needs ``metrics_api_key`` (or an admin's key) once that is set. A cluster member's forward
(trusted by :mod:`.forwards`) carries its key in its body and is identified where that is
read."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ...cluster import FORWARDED_HEADER
from ...coordinator import Coordinator
from ...errors import BadRequest, ModelBossError, Unauthorized
from ...observability import tracing
from ...tenancy.keys import Identity, with_identity
from ..errors import error_response
from ..ollama import ADMIN_PATHS, is_ollama_path
from .keys import KeyCheck, check_key, given_key, identity
from .tracing import edge_stage, told

METRICS_PATH = "/metrics"
OPEN_PATHS = {"/health", METRICS_PATH}
# under /api/, yet any key may use them, on its own: its usage, its jobs, and the reference
# voices of the models in its scope (input to those models, as a request's text is)
USER_API_PATHS = {"/api/v1/usage"}
USER_API_PREFIXES = ("/api/v1/jobs", "/api/v1/voices")
# The dashboard's static files: no state, no secret; the page asks for a key when the API does.
OPEN_PREFIXES = ("/ui/",)


class Identify:
    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator
        # built once the app is (tracing is configured by then): off, no span is asked for
        self.traced = tracing.on()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # a socket's refusal is an HTTP answer
            await self.app(scope, receive, send)
            return
        if self.traced:  # the check as the request span's child, with its outcome
            with edge_stage("model_boss.authenticate") as stage:
                who = self._identify(scope)
                if isinstance(who, ModelBossError):
                    told(stage, refused=who)
                else:
                    told(stage, who=who)
        else:
            who = self._identify(scope)
        if isinstance(who, ModelBossError):
            await error_response(who)(scope, receive, send)
            return
        await self.app(with_identity(scope, who), receive, send)

    def _identify(self, scope: Scope) -> Identity | ModelBossError:
        """Who the request is, or why it is refused."""
        headers = Headers(scope=scope)
        keys = self.coord.keys
        path = scope["path"]
        if path == METRICS_PATH and not self._scrape_allowed(headers):
            return Unauthorized(
                "/metrics needs the metrics_api_key (or an admin's key) as its bearer")
        if FORWARDED_HEADER in headers or not keys.enforced:
            return Identity(end_user=headers.get("x-client-id"))
        if _open(path):
            # told apart, never refused: a good key is the identity, anything else no one
            checked = check_key(given_key(headers), keys, admin=False)
            return identity(checked if checked.allowed else KeyCheck(False), headers)
        # a key's own usage and jobs: with no user key, only an admin reads them
        checked = check_key(given_key(headers), keys, admin=_admin_path(path) or (
            not keys.users_enforced and _user_api_path(path)))
        if not checked.allowed:
            return checked.error or Unauthorized("missing or invalid API key")
        who = identity(checked, headers)
        if who.keyed and who.end_user == "":
            return BadRequest("X-Client-Id: must not be empty (leave the header out)",
                              param="x_client_id", code="invalid_value")
        return who

    def _scrape_allowed(self, headers: Headers) -> bool:
        """``/metrics``: open while ``metrics_api_key`` is unset; else that key or an
        admin's."""
        scrape_key = self.coord.settings.metrics_api_key
        if scrape_key is None:
            return True
        given = given_key(headers)
        if hmac.compare_digest(given.encode(), scrape_key.get_secret_value().encode()):
            return True
        checked = check_key(given, self.coord.keys, admin=True)
        return checked.allowed and checked.record is not None


def _admin_path(path: str) -> bool:
    """The admin API: ``/api/*`` but Ollama's data routes, and a key's own usage and jobs."""
    return path.startswith("/api/") and not _user_api_path(path) and (
        not is_ollama_path(path) or path in ADMIN_PATHS)


def _user_api_path(path: str) -> bool:
    return path in USER_API_PATHS or path.startswith(USER_API_PREFIXES)


def _open(path: str) -> bool:
    """Paths that need no key: health, metrics and the dashboard's page and files."""
    return path in OPEN_PATHS or path == "/ui" or path.startswith(OPEN_PREFIXES)
