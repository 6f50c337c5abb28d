"""SpareWorkers: a pre-started worker process, imports done and no model, for the next cold load.

Most of a diffusers or transformers worker's cold start is the interpreter and the imports of
torch and diffusers (or transformers and sentence-transformers), not ``from_pretrained``. A
spare is that worker started ahead of time with ``--spare``: it holds no model, no lease and no
slot, and is never granted a request. A cold load of a model of its kind *takes* it: the backend
adopts the spare's process, port and secret and names the model in an authenticated ``POST
/load``; the slot becomes READY only through the load's usual checks (lease still held, process
alive). Once that load has ended a new spare is started in the background, so the two do not
compete for the CPU meanwhile.

A spare is a :class:`WorkerProcess` like any worker: its own process group, the parent-death
signal, a pid file the next coordinator reaps, stopped with the pool. It gets its per-worker
secret in its environment at spawn, like a cold start. One that dies is replaced, unless it died
young several times in a row (then spares of that kind stay off and an event says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import psutil

from ..errors import LoadFailed
from .http_link import plain_http_tls
from .processes import WorkerProcess, WorkerTemplates, free_port
from .worker_errors import upstream_error

if TYPE_CHECKING:
    from ..catalog import ModelManifest
    from ..events import EventBus
    from ..gpu.placement import Placement
    from ..settings import Settings

log = logging.getLogger(__name__)

DIFFUSERS = "diffusers"
TRANSFORMERS = "transformers"
_MODULES = {DIFFUSERS: "workers.diffusers", TRANSFORMERS: "workers.transformers"}
_ANSWER_POLL_S = 0.1  # while a spare imports (seconds, off any request's path)
_YOUNG_DEATH_S = 30.0  # a spare that dies sooner than this counts towards giving up
_GIVE_UP_AFTER = 3  # young deaths in a row


@dataclass(eq=False)
class Spare:
    """One pre-started worker: its process, port and secret (handed over on :meth:`take`)."""

    kind: str
    process: WorkerProcess
    port: int
    secret: str
    started_at: float = field(default_factory=time.monotonic)
    ready_s: float | None = None  # seconds from spawn until it answered (imports done)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def to_dict(self) -> dict[str, Any]:
        rss = None
        with contextlib.suppress(psutil.Error, TypeError):
            rss = psutil.Process(self.pid).memory_info().rss // 2**20  # type: ignore[arg-type]
        return {"kind": self.kind, "pid": self.pid, "port": self.port,
                "ready": self.ready_s is not None, "ready_s": self.ready_s, "rss_mb": rss}


def spare_argv(kind: str, port: int) -> list[str]:
    """The command line of a spare of ``kind`` (``diffusers`` or ``transformers``)."""
    return [sys.executable, "-m", _MODULES[kind], "--spare", "--host", "127.0.0.1",
            "--port", str(port), "--parent-pid", str(os.getpid())]


class SpareWorkers:
    """At most one spare per kind; :meth:`take` hands a ready one over, :meth:`replenish`
    starts the next. Off when ``settings.spare_workers`` is false."""

    def __init__(self, settings: Settings, events: EventBus,
                 templates: WorkerTemplates | None = None) -> None:
        self.settings = settings
        self.events = events
        self.templates = templates
        self.enabled = settings.spare_workers
        self._ready: dict[str, Spare] = {}
        self._starting: dict[str, asyncio.Task] = {}
        self._coming: dict[str, Spare] = {}  # started, imports not yet done
        self._young_deaths: dict[str, int] = {}
        self._given_up: set[str] = set()

    def replenish(self, kind: str = DIFFUSERS) -> None:
        """Start a spare of ``kind`` in the background unless one is there or on its way."""
        if not self.enabled or kind in self._given_up or kind in self._ready \
                or kind in self._starting:
            return
        task = asyncio.create_task(self._start(kind), name=f"spare-{kind}")
        self._starting[kind] = task
        task.add_done_callback(lambda t, k=kind: self._started(k, t))

    def _started(self, kind: str, task: asyncio.Task) -> None:
        self._starting.pop(kind, None)
        if not task.cancelled() and task.exception() is None and task.result() is False:
            self.replenish(kind)  # it did not come up: again, unless they keep failing

    def take(self, kind: str) -> Spare | None:
        """The ready spare of ``kind``, now the caller's (its process, port and secret), or
        None. Synchronous: no other load can take the same spare."""
        spare = self._ready.pop(kind, None)
        if spare is None:
            return None
        spare.process.on_exit = None  # the adopter watches it from here on
        if not spare.process.running:
            self.replenish(kind)
            return None
        self._young_deaths[kind] = 0
        self.events.emit("spare_taken", worker_kind=kind, pid=spare.pid)
        return spare

    def status(self) -> list[dict[str, Any]]:
        return [spare.to_dict() for spare in (*self._ready.values(), *self._coming.values())]

    async def _start(self, kind: str) -> bool:
        port, secret = free_port(), secrets.token_urlsafe(32)
        state = self.settings.state_path
        # what a cold start's environment has, less the manifest's env and the placement
        env = dict(os.environ, WORKER_API_KEY=secret, PYTHONPATH=_pythonpath())
        torch_defaults(env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.pop("CUDA_VISIBLE_DEVICES", None)  # POST /load sets it, before CUDA's first use
        process = WorkerProcess(f"spare-{kind}", spare_argv(kind, port), env=env,
                                pid_dir=state / "workers", log_file=state / "logs" /
                                f"spare-{kind}.log", templates=self.templates)
        spare = Spare(kind, process, port, secret)
        self._coming[kind] = spare
        try:
            await process.start()
            await self._until_answering(spare)
        except asyncio.CancelledError:
            await process.stop(self.settings.stop_grace_s)
            raise
        except Exception as exc:
            log.warning("spare %s worker did not come up: %s", kind, exc)
            await process.stop(self.settings.stop_grace_s)
            self._count_death(kind)
            return False
        finally:
            self._coming.pop(kind, None)
        spare.ready_s = round(time.monotonic() - spare.started_at, 3)
        process.on_exit = lambda code: self._died(spare, code)  # from here on, not before
        self._ready[kind] = spare
        self.events.emit("spare_ready", worker_kind=kind, pid=spare.pid, seconds=spare.ready_s,
                         rss_mb=spare.to_dict()["rss_mb"])
        return True

    async def _until_answering(self, spare: Spare) -> None:
        """Until the spare answers ``/health`` as a spare (it opens its port after imports)."""
        deadline = time.monotonic() + self.settings.health_timeout_s
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{spare.port}",
                                     headers={"Authorization": f"Bearer {spare.secret}"},
                                     verify=plain_http_tls()) as c:
            while time.monotonic() < deadline:
                if not spare.process.running:
                    raise RuntimeError(f"exited with {spare.process.returncode}: "
                                       f"{spare.process.last_line()}")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    reply = await c.get("/health", timeout=2.0)
                    if reply.json().get("state") == "spare":
                        return
                await asyncio.sleep(_ANSWER_POLL_S)
        raise RuntimeError(f"no answer within {self.settings.health_timeout_s:.0f}s")

    def _died(self, spare: Spare, code: int) -> None:
        """A spare nobody had taken exited: drop it and start another (unless they keep dying
        young)."""
        if self._ready.get(spare.kind) is spare:
            del self._ready[spare.kind]
        log.warning("spare %s worker (pid %s) exited with %s: %s", spare.kind, spare.pid, code,
                    spare.process.last_line())
        self.events.emit("spare_exited", worker_kind=spare.kind, pid=spare.pid, code=code)
        if time.monotonic() - spare.started_at < _YOUNG_DEATH_S:
            self._count_death(spare.kind)
        else:
            self._young_deaths[spare.kind] = 0
        self.replenish(spare.kind)

    def _count_death(self, kind: str) -> None:
        self._young_deaths[kind] = self._young_deaths.get(kind, 0) + 1
        if self._young_deaths[kind] >= _GIVE_UP_AFTER:
            self._given_up.add(kind)
            self.events.emit("spare_disabled", worker_kind=kind,
                             reason=f"{_GIVE_UP_AFTER} spares in a row died young")

    async def shutdown(self) -> None:
        """Stop every spare, ready or starting."""
        self.enabled = False
        for task in list(self._starting.values()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for spare in list(self._ready.values()):
            spare.process.on_exit = None
            with contextlib.suppress(Exception):
                await spare.process.stop(self.settings.stop_grace_s)
        self._ready.clear()


class TakesSpares:
    """For a worker backend whose cold load can run in a spare of ``spare_kind``: ``start``
    takes the ready spare (unless the manifest sets an environment of its own, which a running
    process cannot take), names the model in ``POST /load`` with :meth:`model_flags`, and
    starts the next spare once that load has ended. Mixed in before ``HttpWorkerBackend``."""

    spare_kind: str
    spares: SpareWorkers | None = None  # the pool's, when it keeps spare workers
    manifest: ModelManifest
    settings: Settings
    _client: httpx.AsyncClient | None
    with_install_hint: Callable[[str], str]  # HttpWorkerBackend's

    def model_flags(self, placement: Placement | None) -> list[str]:
        raise NotImplementedError

    async def start(self, port: int, placement: Placement | None) -> None:
        spare = self.spares.take(self.spare_kind) if self.spares and not self.manifest.env \
            else None
        if spare is None:
            return await super().start(port, placement)  # type: ignore[misc]
        try:
            await self._load_in(spare, placement)
        finally:
            self.spares.replenish(self.spare_kind)  # type: ignore[union-attr]

    async def _load_in(self, spare: Spare, placement: Placement | None) -> None:
        """Adopt ``spare`` (process, port, secret) and name the model in ``POST /load``; it
        answers when the load is over. A failure stops the spare like a failed cold start."""
        self._attach(spare.port, spare.secret, spare.process)  # type: ignore[attr-defined]
        body = {"args": self.model_flags(placement),
                "cuda_visible_devices": placement.cuda_visible_devices if placement else ""}
        try:
            assert self._client is not None
            try:
                reply = await self._client.post("/load", json=body,
                                                timeout=self.settings.health_timeout_s)
            except httpx.TransportError as exc:
                raise await self.crashed(exc) from exc  # type: ignore[attr-defined]
            if reply.status_code != 200:  # it answers as /health would: 200 once loaded
                detail = upstream_error(self.manifest.id, reply.status_code, reply.content)
                raise LoadFailed(f"spare worker could not load '{self.manifest.id}': "
                                 f"{self.with_install_hint(detail.message)}")
        except BaseException:
            await self.stop()  # type: ignore[attr-defined]
            raise


# how long torch's idle CPU threads spin before they sleep (GNU OpenMP's unit: turns of its
# wait loop, about 27 ns each here; its default is 300,000)
OMP_SPIN_TURNS = 100_000


def torch_defaults(env: dict[str, str]) -> dict[str, str]:
    """A torch worker's environment defaults, under what the user set: no hub calls (a model is
    a local folder), and torch's CPU threads spin briefly between operations, then sleep.

    GNU OpenMP's idle threads spin for about 300,000 turns (10 ms here) after each operation
    before they sleep, on the cores the coordinator serves from; ``OMP_WAIT_POLICY=PASSIVE``
    (no spin) makes every operation of a forward wake them again: a batch of 32 sentences ran
    in 93-104 ms instead of 73-77 ms. A third of the default spin keeps the forward's pace and
    leaves the cores a few ms after it (docs/BENCHMARKS.md, embeddings_batching.py)."""
    env.setdefault("HF_HUB_OFFLINE", "1")
    if "OMP_WAIT_POLICY" not in env:  # the user's policy sets its own spin
        env.setdefault("GOMP_SPINCOUNT", str(OMP_SPIN_TURNS))
    return env


def _pythonpath() -> str:
    """The checkout root first, so ``-m workers.diffusers`` finds this project's workers."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
