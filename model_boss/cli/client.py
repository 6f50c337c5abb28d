"""The one way the command line talks to a daemon: :class:`DaemonClient` (its base URL, the
key sent as a bearer token, a timeout) asks and returns the parsed JSON; every way that goes
wrong is a :class:`DaemonError` whose text is the one line :func:`report` prints."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx

from ..errors import error_text, network_reason

# the bearer key the admin commands send: the first of these that is set
ADMIN_KEY_VARIABLES = ("MODEL_BOSS_ADMIN_API_KEY", "MODEL_BOSS_API_KEY")
# how long a table (ps, its redraws) waits for its document, however long --timeout allows
TABLE_TIMEOUT_S = 10.0

Timeout = float | httpx.Timeout | None
T = TypeVar("T")


class DaemonError(Exception):
    """Why a command got no answer it can use, as one line (printed after ``model-boss: ``)."""


class DaemonUnreachable(DaemonError):
    """No answer at all: the connection failed (refused, no such host, TLS, a timeout)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach {url}: {reason}")
        self.url = url
        self.reason = reason


class DaemonRefused(DaemonError):
    """An error answer: the daemon's own message (OpenAI's envelope, or any other) and the
    status it came with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DaemonUnreadable(DaemonError):
    """An answer this command cannot read: not JSON, or a document of another shape."""


def admin_key(environ: Mapping[str, str]) -> str | None:
    """The key the admin commands send: ``MODEL_BOSS_ADMIN_API_KEY``, else
    ``MODEL_BOSS_API_KEY``; None when neither is set."""
    return next((environ[name] for name in ADMIN_KEY_VARIABLES if environ.get(name)), None)


class DaemonClient:
    """A daemon at ``url``, asked with ``key`` as ``Authorization: Bearer``. ``transport``
    carries the requests (a test's seam; None: the network). Its HTTP client is made at the
    first question, so a command that asks nothing (``serve``) pays nothing for it."""

    def __init__(self, url: str, key: str | None = None, *, timeout: float = 600.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.transport = transport
        self._http: httpx.Client | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}

    @property
    def http(self) -> httpx.Client:
        """The HTTP client itself (base URL, key, timeout), for code that speaks httpx and
        says its own errors (``launch``'s questions)."""
        if self._http is None:
            self._http = httpx.Client(base_url=self.url, headers=self.headers,
                                      timeout=self.timeout, transport=self.transport)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None, *,
                params: Mapping[str, str] | None = None, timeout: Timeout = None) -> Any:
        """The JSON the daemon answers ``method path`` with; ``timeout`` None: the client's."""
        response = self._send(method, path, body, params=params, timeout=timeout)
        try:
            return response.json()
        except ValueError as exc:
            raise DaemonUnreadable(
                f"{self.url}{path} answered something other than JSON (HTTP "
                f"{response.status_code}): {error_text(response.content)[:200]}") from exc

    def get(self, path: str, *, params: Mapping[str, str] | None = None,
            timeout: Timeout = None) -> Any:
        return self.request("GET", path, params=params, timeout=timeout)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Any = None) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def text(self, path: str, *, params: Mapping[str, str] | None = None) -> str:
        """What ``GET path`` answers, as text (``usage --csv``)."""
        return self._send("GET", path, params=params).text

    @contextlib.contextmanager
    def stream(self, method: str, path: str, body: Any = None, *,
               timeout: Timeout = None) -> Iterator[httpx.Response]:
        """An answer read as it comes (``pull``'s progress, ``ps --watch``'s events); a
        connection lost while reading is :class:`DaemonUnreachable` too."""
        try:
            with self.http.stream(method, path, json=body,
                                  timeout=self.timeout if timeout is None else timeout
                                  ) as response:
                if response.status_code >= 400:
                    raise DaemonRefused(response.status_code,
                                        error_text(response.read(), response.status_code))
                yield response
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise DaemonUnreachable(self.url, network_reason(exc)) from exc

    def readable(self, draw: Callable[[Any], T], document: Any) -> T:
        """``draw(document)``; a document of another shape (a daemon of another version) is
        :class:`DaemonUnreadable`, not a traceback."""
        try:
            return draw(document)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DaemonUnreadable(
                f"{self.url} answered a document this command cannot read "
                f"({type(exc).__name__}: {exc}); is it a model-boss daemon of this version?"
            ) from exc

    def _send(self, method: str, path: str, body: Any = None, *,
              params: Mapping[str, str] | None = None, timeout: Timeout = None
              ) -> httpx.Response:
        try:
            response = self.http.request(method, path, json=body, params=params,
                                         timeout=self.timeout if timeout is None else timeout)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise DaemonUnreachable(self.url, network_reason(exc)) from exc
        if response.status_code >= 400:
            raise DaemonRefused(response.status_code,
                                error_text(response.content, response.status_code))
        return response


def report(error: DaemonError) -> int:
    """Say ``error`` in its one line on stderr; the exit status a failed command has."""
    print(f"model-boss: {error}", file=sys.stderr)
    return 1
