"""InferenceBackend: the protocol every worker kind speaks, and the HTTP-worker base class."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import orjson

from ..catalog import CatalogEntry
from ..catalog.extras import default_llama_worker, install_hint, requirement
from ..errors import LoadFailed, ModelBossError, WorkerCrashed
from ..gpu.placement import Placement
from ..settings import Settings
from .http_link import plain_http_tls
from .processes import WorkerProcess, WorkerTemplates, exit_words
from .upstream import UpstreamClient, UpstreamTransportError
from .worker_errors import upstream_error

_JSON = {"content-type": "application/json"}
# how often a starting worker is asked whether it is up: a loopback call costs about a
# millisecond, and every interval adds half itself to a cold start on average
_STARTUP_POLL_S = 0.02
log = logging.getLogger(__name__)


def exit_story(backend: object, code: int | None) -> str:
    """For the log and the admin status: how a worker ended, and its last error lines."""
    process = getattr(backend, "process", None)
    errors = process.error_lines() if isinstance(process, WorkerProcess) else []
    story = f"worker stopped unexpectedly ({exit_words(code)})"
    return story + (f"; its last error lines: {' | '.join(errors)}" if errors else "")
ProgressCallback = Callable[[str, "float | None"], None]


@dataclass(slots=True)
class UpstreamResponse:
    """A worker's answer: a whole body, or a stream of raw chunks passed through as they come."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None

    def json(self) -> Any:
        return orjson.loads(self.body or b"null")


class InferenceBackend(Protocol):
    """What the pool needs from a worker kind."""

    needs_vram: bool
    can_offload: bool
    on_exit: Callable[[int], None] | None
    on_progress: ProgressCallback | None  # (stage, fraction) while starting, where known
    port: int | None  # where the worker listens, once started

    @property
    def pid(self) -> int | None: ...

    @property
    def alive(self) -> bool:
        """The worker can take a request now (checked at every grant, synchronously)."""
        ...

    async def start(self, port: int, placement: Placement | None) -> None: ...

    async def stop(self) -> None: ...

    async def retire(self) -> None:
        """A planned stop follows (eviction, unload, shutdown): keep what can be kept."""

    async def health_check(self) -> bool: ...

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse: ...

    async def offload(self) -> dict[str, Any]: ...

    async def onload(self) -> dict[str, Any]: ...

    async def report(self) -> dict[str, Any]: ...

    async def kv_cache_usage(self) -> float | None:
        """The worker's KV-cache use (0 to 1), None where it does not count it."""


class HttpWorkerBackend:
    """A worker that is a local HTTP server we spawn: start, health-poll, proxy, stop.

    Subclasses say how to build the command line (:meth:`argv`) and where health lives.
    A worker that names ``secret_env`` is started with a fresh random secret in that variable
    (never in argv, which ``ps`` shows) and every call to it carries ``Authorization: Bearer``.

    While it starts, ``on_progress(stage, fraction)`` hears where it is: "loading" once it
    answers but is not healthy yet (:meth:`loading_stage` reads what the answer says), and the
    stages its output lines name (``log_stages``).
    """

    needs_vram = True
    templates: WorkerTemplates | None = None  # the pool's: forks Python workers
    can_offload = False
    health_path = "/health"
    secret_env: str | None = None  # the variable the worker reads its API key from
    log_stages: tuple[tuple[str, str], ...] = ()  # (text in an output line, stage it marks)

    def __init__(self, entry: CatalogEntry, settings: Settings) -> None:
        self.entry = entry
        self.manifest = entry.manifest
        self.settings = settings
        self.port: int | None = None
        self.process: WorkerProcess | None = None
        self.on_exit: Callable[[int], None] | None = None
        self.on_progress: ProgressCallback | None = None
        self._client: httpx.AsyncClient | None = None
        self._upstream: UpstreamClient | None = None
        self.secret: str | None = None
        self._headers: dict[str, str] = dict(_JSON)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def alive(self) -> bool:
        """Asks the kernel, not the exit watcher, so a worker that died a moment ago is never
        granted a request before the watcher has run."""
        process = self.process
        if process is None:
            return False
        exited = process.exited()
        if exited is None:  # no pidfd: /proc says whether it is gone or a zombie
            return process.running and process.pid is not None and pid_alive(process.pid)
        return not exited

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        raise NotImplementedError

    def environment(self, placement: Placement | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.manifest.env)
        env["CUDA_VISIBLE_DEVICES"] = placement.cuda_visible_devices if placement else ""
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.secret_env and self.secret:
            env[self.secret_env] = self.secret
        return env

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"} if self.secret else {}

    async def start(self, port: int, placement: Placement | None) -> None:
        # one secret per worker start, known only to this backend and the worker
        self.secret = secrets.token_urlsafe(32) if self.secret_env else None
        state = self.settings.state_path
        self._attach(port, self.secret, WorkerProcess(
            self.manifest.id, self.argv(port, placement), env=self.environment(placement),
            pid_dir=state / "workers", log_file=state / "logs" / f"{_safe(self.manifest.id)}.log",
            templates=self.templates))
        assert self.process is not None
        try:
            await self.process.start()
            await self._wait_healthy(self.settings.health_timeout_s)
        except BaseException:
            await self.stop()
            raise
        finally:
            if self.process is not None:
                self.process.on_line = None

    def _attach(self, port: int, secret: str | None, process: WorkerProcess) -> None:
        """Make ``process`` on ``port`` (answering to ``secret``) this backend's worker."""
        self.port, self.secret, self.process = port, secret, process
        self._headers = {**_JSON, **self._auth()}
        self.process.on_exit = self._exited
        self.process.on_line = self._saw_line if self.log_stages else None
        self._client = httpx.AsyncClient(  # control calls: health, offload, reports
            base_url=f"http://127.0.0.1:{port}", headers=self._auth(), verify=plain_http_tls(),
            timeout=httpx.Timeout(self.settings.request_timeout_s, connect=5.0))
        # the request data path; idle connections are dropped before llama.cpp's server
        # closes them (its keep-alive timeout is 5 s), so none is reused as it closes
        self._upstream = UpstreamClient(f"http://127.0.0.1:{port}",
                                        timeout_s=self.settings.request_timeout_s,
                                        connect_timeout_s=5.0, max_connections=64,
                                        keepalive_s=3.0, peer="the worker")

    def _report(self, stage: str, fraction: float | None = None) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(stage, fraction)
            except Exception as exc:  # progress is news, never a reason to fail a load
                log.debug("progress report of %s failed: %s", self.manifest.id, exc)

    def _saw_line(self, line: str) -> None:
        for text, stage in self.log_stages:
            if text in line:
                self._report(stage)

    def loading_stage(self, response: httpx.Response) -> tuple[str, float | None]:
        """What a health answer that is not 200 yet says: the worker is up and loading."""
        return "loading", None

    def _exited(self, code: int) -> None:
        if self.on_exit:
            self.on_exit(code)

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if not self.process.running:
                await asyncio.sleep(0.1)  # let the output reader drain
                raise LoadFailed(
                    f"the worker of '{self.manifest.id}' stopped while loading "
                    f"({exit_words(self.process.returncode)}): "
                    f"{self.with_install_hint(self._tail_text())}")
            if await self._probe_starting():
                return
            await asyncio.sleep(_STARTUP_POLL_S)
        raise LoadFailed(f"worker for '{self.manifest.id}' did not become healthy within "
                         f"{timeout_s:.0f}s: {self._tail_text()}", retry_after_s=10)

    def _tail_text(self, lines: int = 5) -> str:
        """The worker's last error lines; its last lines when none reads as an error."""
        if self.process is not None and (errors := self.process.error_lines(lines)):
            return " | ".join(errors)
        tail = [line for line in (self.process.tail() if self.process else []) if line.strip()]
        return " | ".join(tail[-lines:]) or "(no output)"

    async def _probe_starting(self) -> bool:
        """One health probe while starting: True once healthy; a 503 tells how far the load
        is, or that it failed (LoadFailed at once, in the worker's own words)."""
        response = await self._health()
        if response is not None and response.status_code == 503:
            if (error := self.load_failure(response)) is not None:
                raise LoadFailed(f"loading '{self.manifest.id}' failed in its worker: "
                                 f"{self.with_install_hint(error)}")
            self._report(*self.loading_stage(response))
        return response is not None and response.status_code == 200

    def load_failure(self, response: httpx.Response) -> str | None:
        """The worker's error when a health answer says its load failed for good (the Python
        workers stay up and answer ``{"state": "failed", "error": ...}``); None otherwise."""
        try:
            body = response.json()
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("state") != "failed":
            return None
        return str(body.get("error") or "the worker gave no reason")

    def with_install_hint(self, error: str) -> str:
        """``error``, followed by the extra to install when it is a module this kind of
        worker needs that is missing (catalog/extras.py)."""
        needed = requirement(self.manifest, default_llama_worker(self.settings))
        hint = install_hint(needed, error)
        return f"{error}; {hint}" if hint else error

    async def _health(self) -> httpx.Response | None:
        """The worker's health answer; None when it does not answer."""
        if self._client is None:
            return None
        try:
            return await self._client.get(self.health_path, timeout=2.0)
        except httpx.HTTPError:
            return None

    async def health_check(self) -> bool:
        response = await self._health()
        return response is not None and response.status_code == 200

    async def retire(self) -> None:
        """Nothing to keep by default (a llama.cpp server saves its prompt caches)."""

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop(self.settings.stop_grace_s)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None

    async def crashed(self, exc: Exception) -> WorkerCrashed:
        """The error for a broken worker connection, in the client's words (what ended and
        what to do); the cause and the worker's last error lines go to the log."""
        if self.process is not None and self.process.running:
            await self.process.wait_exit(0.5)
        code = self.process.returncode if self.process else None
        log.warning("%s: %s (%s: %s)", self.manifest.id, exit_story(self, code),
                    type(exc).__name__, exc)
        if code is None:
            return WorkerCrashed(f"The worker of '{self.manifest.id}' broke off the request "
                                 "(its connection closed). Retry the request.")
        return WorkerCrashed(f"The worker of '{self.manifest.id}' stopped unexpectedly "
                             f"({exit_words(code)}). Retry the request: the next one loads "
                             "the model again.")

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        return await self.proxy("POST", endpoint, body, stream)

    async def proxy(self, method: str, path: str, body: dict[str, Any] | None,
                    stream: bool) -> UpstreamResponse:
        """Forward a POST to the worker on the pooled data-path client."""
        if self._upstream is None:
            raise WorkerCrashed(f"worker for '{self.manifest.id}' is not running")
        content = orjson.dumps(body) if body is not None else b""
        return await forward(self._upstream, path, content, self.request_headers(stream),
                             stream, self.manifest.id, self.crashed)

    def request_headers(self, stream: bool) -> dict[str, str]:
        """Headers of a proxied request: JSON, and the worker's secret when it has one."""
        return self._headers

    async def offload(self) -> dict[str, Any]:
        raise ModelBossError(f"'{self.manifest.id}' cannot be offloaded to CPU RAM",
                             status_code=400, code="offload_unsupported")

    async def onload(self) -> dict[str, Any]:
        raise ModelBossError(f"'{self.manifest.id}' cannot be onloaded",
                             status_code=400, code="offload_unsupported")

    async def report(self) -> dict[str, Any]:
        return {}

    async def kv_cache_usage(self) -> float | None:
        return None  # only llama.cpp's server counts it (backends/llama)

    async def control(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A POST to the worker's own control routes (offload, onload, cancel), errors mapped."""
        if self._client is None:
            raise WorkerCrashed(f"worker for '{self.manifest.id}' is not running")
        try:
            response = await self._client.post(path, json=body,
                                               timeout=self.settings.request_timeout_s)
        except httpx.TransportError as exc:
            raise await self.crashed(exc) from exc
        if response.status_code >= 400:
            raise upstream_error(self.manifest.id, response.status_code, response.content)
        return response.json()

    async def worker_report(self, path: str = "/health", timeout_s: float = 5) -> dict[str, Any]:
        """A worker's report; {} when it cannot say (not running, busy, gone)."""
        if self._client is None:
            return {}
        try:
            response = await self._client.get(path, timeout=timeout_s)
        except httpx.HTTPError:
            return {}
        return response.json() if response.status_code == 200 else {}


async def forward(client: UpstreamClient, path: str, content: bytes, headers: dict[str, str],
                  stream: bool, model_id: str,
                  transport_error: Callable[[Exception], Awaitable[ModelBossError]],
                  *, our_secret: bool = True) -> UpstreamResponse:
    """POST on the pooled client; 4xx/5xx mapped by :func:`upstream_error`, transport failures
    (also mid-stream) by ``transport_error``; stream chunks relayed as they arrive."""
    try:
        reply = await client.post(path, content, headers, stream)
    except UpstreamTransportError as exc:
        raise await transport_error(exc) from exc
    if reply.status >= 400:
        raise upstream_error(model_id, reply.status, reply.body or b"", our_secret=our_secret)
    kind = {"content-type": reply.content_type}
    if reply.chunks is None:
        return UpstreamResponse(reply.status, kind, body=reply.body)
    chunks = reply.chunks

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        except UpstreamTransportError as exc:
            raise await transport_error(exc) from exc
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    return UpstreamResponse(reply.status, kind, stream=relay())



def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def pid_alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (dead, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return _signal_zero(pid)
    return state not in (b"Z", b"X", b"x")


def _signal_zero(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
