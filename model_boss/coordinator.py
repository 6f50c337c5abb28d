"""Coordinator: builds catalog, GPUBoss, pool and queue from settings; owns their loops."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psutil

from .backends.processes import reap_orphans
from .backends.spare import DIFFUSERS, TRANSFORMERS
from .catalog import BackendKind, build_catalog
from .catalog.live import LiveCatalog
from .catalog.pulls import Pulls
from .catalog.tasks import TaskRegistry
from .errors import ConfigError, ModelBossError
from .events import EventBus
from .gpu import EmbeddedLeaseStore, GPUBoss, context_fitter, discover_gpus, open_nvml
from .gpu.lease import LeaseStore
from .image_files import media_stores
from .jobs import EmbeddedJobStore, Job, JobManager, RedisJobStore
from .jobs.runner import Answer, Dispatched, JobRunner, Reported
from .observability import tracing
from .observability.history import History, RequestRing
from .observability.metrics import Metrics
from .runtime_config import RuntimeConfig, RuntimeValues
from .scheduling.queue import InferenceQueue
from .scheduling.router import ModelRouter
from .settings import PreloadEntry, Settings
from .slots.changes import take_catalog_change
from .slots.drain import Drain
from .slots.pool import BackendFactory, ModelPool, default_backend_factory
from .tenancy.keys import EndUserAdmission, KeyStore, MinuteWindows, exposure_warning
from .tenancy.usage import Spent, UsageLedger, UsageRow

log = logging.getLogger(__name__)


if TYPE_CHECKING:
    from .cluster import Cluster

# serves one job's request through the same path a live request takes (services.run_job)
JobWork = Callable[["Coordinator", Job, Dispatched, Reported], Awaitable[Answer]]


class Coordinator:
    """Everything one daemon runs. ``start()`` / ``stop()`` bracket its life."""

    def __init__(self, settings: Settings, *,
                 backend_factory: BackendFactory = default_backend_factory,
                 job_work: JobWork | None = None) -> None:
        """``job_work`` serves a job's request (the service layer's ``run_job``); the
        coordinator sits below the services and is handed it instead of importing it.
        Without it, a submitted job fails with :class:`~.errors.ConfigError`."""
        self.settings = settings
        self.events = EventBus()
        self.metrics = Metrics()
        self.events.listen(self.metrics.on_event)
        self.keys = KeyStore(settings, settings.state_path / "keys.sqlite3")
        self.key_windows = MinuteWindows()
        self.usage = UsageLedger(settings.state_path / "usage.sqlite3"
                                 if settings.usage_ledger else None)
        # each end user's rates and day under its key (a key's end_user_limits)
        self.end_users = EndUserAdmission(self.usage.end_user_spent)
        self.started_at = time.time()
        self.nvml = open_nvml() if settings.use_nvml else None
        self.gpus = discover_gpus(settings.gpus, self.nvml)
        self.context_fit = context_fitter(self.gpus, settings.vram_margin_mb, self.nvml)
        self.catalog = build_catalog(settings, self.context_fit)
        self.store = self._make_store()
        self.boss = GPUBoss(self.store, self.gpus, margin_mb=settings.vram_margin_mb,
                            nvml=self.nvml, ttl_s=settings.lease_ttl_s)
        self.pool = ModelPool(self.catalog, self.boss, settings, self.events,
                              backend_factory=backend_factory)
        self.boss.on_lease_lost = self.pool.lease_lost
        self.queue = InferenceQueue(self.pool, settings, self.events)
        self.queue.meter.on_row = self.used
        self.history = History(self.boss, self.pool, self.queue, settings.history_step_s)
        self.queue.on_granted = self._granted
        self.events.listen(self.history.on_event)
        # the request log also keeps its last rows in memory (GET /api/v1/requests)
        self.requests = RequestRing(self.queue.request_log.path)
        self.requests.listeners.append(self.history.finished)
        self.queue.request_log = self.requests
        self.tasks = TaskRegistry.load(settings.tasks_file, self.catalog)
        self.runtime = RuntimeConfig(
            RuntimeValues(allow_cloud_fallback=settings.allow_cloud_fallback),
            state_file=settings.state_path / "runtime_config.json",
            redis_url=settings.redis_url)
        self.router = ModelRouter(self.catalog, self.tasks, self.pool, self.runtime)
        drain_s = settings.request_timeout_s
        self.live = LiveCatalog(settings, self.catalog, self.tasks, self.events,
                                lambda diff: take_catalog_change(self.pool, diff, drain_s),
                                fit=self.context_fit)
        self.pulls = Pulls(settings, self.catalog, self.events, self.reload,
                           lambda model_id, why: self.pool.unload(model_id, why,
                                                                  wait_s=drain_s))
        for position, preload in enumerate(settings.preload):
            if preload.model not in self.catalog:
                known = ", ".join(sorted(e.manifest.id for e in self.catalog)) or "none"
                raise ConfigError(f"settings: preload.{position}: unknown model "
                                  f"'{preload.model}' (models: {known})")
        self.image_files, self.video_files = media_stores(settings.state_path, settings.videos_mb)
        self.base_url = f"http://{settings.host}:{settings.port}"
        job_store = (RedisJobStore(settings.redis_url, max_jobs=settings.max_jobs)
                     if settings.redis_url else EmbeddedJobStore(settings.max_jobs))
        runner = JobRunner(self.catalog, self.pool, self._job_work)
        self.job_work = job_work
        self.cluster: Cluster | None = None
        if settings.cluster:  # only a member loads the Redis client
            from .cluster import Cluster

            self.cluster = Cluster(settings, self.catalog, self.pool, self.queue, self.runtime)
        if self.cluster is not None:
            self.events.listen(self.cluster.on_event)
            self.jobs: JobManager = self.cluster.job_manager(
                job_store, runner, result_ttl_s=settings.job_result_ttl_s,
                max_active=settings.max_jobs)
        else:
            self.jobs = JobManager(job_store, runner,
                                   result_ttl_s=settings.job_result_ttl_s,
                                   max_active=settings.max_jobs)
        self._loops: list[asyncio.Task] = []
        self.drain = Drain(settings.shutdown_grace_s)  # a stop's first part (docs/FAULTS.md)
        self.drain.on_force.append(self.pool.prompt_cache.close)
        if self.cluster is not None:  # the others route around a member that stops
            self.drain.on_begin.append(self.cluster.withdraw)

    def used(self, row: UsageRow) -> None:
        """A finished request's usage: into the ledger (and a cluster's counters), the key's
        minute and the metrics (a ``model_boss.ledger_row`` span where traces are on)."""
        told = tracing.start_span("model_boss.ledger_row", {
            "model_boss.ledger.outcome": row.outcome, "http.response.status_code":
            row.http_status, "model_boss.key": row.key or None,
            "model_boss.end_user": row.end_user or None,
            "model_boss.ledger.gpu_seconds": row.gpu_seconds}) if tracing.on() else None
        try:
            self.usage.record(row)
            if self.cluster is not None:
                self.cluster.tenancy.add(row)
            if row.key:
                self.key_windows.used(row.key, row.at, row.tokens)
                self.end_users.used(row.key, row.end_user, row.at, row.tokens)
            self.metrics.observe_usage(row)
        finally:
            if told is not None:
                told.end()

    def usage_spent(self, key: str, since: float) -> Spent:
        """What ``key`` spent since ``since``: in a cluster, every member's (today's and this
        month's counters); else this ledger's running totals."""
        if self.cluster is not None:
            shared = self.cluster.tenancy.spent(key, since)
            if shared is not None:
                return shared
        return self.usage.spent(key, since)

    async def usage_report(self, **question: Any) -> list[dict[str, Any]]:
        """``GET /api/v1/usage``'s rows: the whole cluster's in a cluster, else this
        ledger's (the arguments of :meth:`UsageLedger.query`)."""
        if self.cluster is not None:
            return await self.cluster.tenancy.query(**question)
        return await self.usage.query(**question)

    def _granted(self, priority: int, waited_s: float) -> None:
        self.metrics.observe_wait(priority, waited_s)
        self.history.granted(priority, waited_s)

    async def _job_work(self, job: Job, dispatched: Dispatched, report: Reported) -> Answer:
        if self.job_work is None:
            raise ConfigError("this coordinator was built without a job service (job_work)")
        return await self.job_work(self, job, dispatched, report)

    def _make_store(self) -> LeaseStore:
        if self.settings.redis_url:
            from .gpu.redis_store import RedisLeaseStore

            # in a cluster each GPU host keeps its leases apart: GPU 0 here is not GPU 0 there
            prefix = f"model-boss:host:{self.settings.member_id}" if self.settings.cluster \
                else "model-boss"
            return RedisLeaseStore(self.settings.redis_url, prefix=prefix)
        return EmbeddedLeaseStore()

    async def start(self) -> None:
        state = self.settings.state_path
        state.mkdir(parents=True, exist_ok=True)
        reaped = reap_orphans(state / "workers")
        if reaped:
            self.events.emit("orphans_reaped", pids=reaped)
        source = self.gpus[0].source if self.gpus else "none"
        gpus = ", ".join(f"{g.index}:{g.name}:{g.vram_mb}MB" for g in self.gpus)
        if source == "declared":
            log.warning("no NVIDIA GPU found: using declared (simulated) GPUs %s; workers run "
                        "on the CPU", gpus)
        else:
            log.info("GPUs from NVML: %s", gpus)
        log.info("lease store: %s", "redis " + self.settings.redis_url
                 if self.settings.redis_url else "embedded (no Redis)")
        if self.exposure_warning:
            log.warning("%s", self.exposure_warning)
        for entry in self.catalog:
            if not entry.available:
                log.warning("model '%s' (%s) is unavailable: %s", entry.manifest.id,
                            entry.manifest.source_file, entry.unavailable_reason)
        await self.boss.publish_inventory()
        await self._release_leases_left_behind()
        await self.runtime.restore()
        await self.keys.start()
        await self.usage.start()
        self.pool.learned.load()
        self._loops = [
            asyncio.create_task(self.queue.run(), name="queue"),
            asyncio.create_task(self.pool.reaper(), name="reaper"),
            asyncio.create_task(self.pool.health_monitor(), name="health"),
            asyncio.create_task(self.history.run(), name="history"),
        ]
        self._loops.append(asyncio.create_task(asyncio.to_thread(self._read_metadata),
                                               name="metadata"))
        for preload in self.settings.preload:
            self._preload(preload)
        # the first image (or embedding, or transcript) skips the imports too
        for backend, kind in ((BackendKind.DIFFUSERS, DIFFUSERS),
                              (BackendKind.TRANSFORMERS, TRANSFORMERS)):
            if any(e.available and e.manifest.backend == backend for e in self.catalog):
                self.pool.spares.replenish(kind)
        if self.cluster is not None:
            await self.cluster.start()
            await self.cluster.tenancy.attach(self.keys, self.usage, self.settings.member_id)
        await self.jobs.start()
        self.live.start()
        self.events.emit("started", gpus=[g.to_dict() for g in self.gpus],
                         models=len(self.catalog))

    async def _release_leases_left_behind(self) -> None:
        """Leases held by an earlier coordinator on this host that is gone (SIGKILLed): its
        workers were reaped above, so their VRAM is free now, not only after the lease TTL."""
        prefix = self.boss.holder.rsplit(":", 1)[0] + ":"
        released = []
        for lease in await self.boss.leases():
            pid = lease.holder[len(prefix):] if lease.holder.startswith(prefix) else ""
            if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
                await self.boss.release(lease.id)
                released.append(lease.id)
        if released:
            log.warning("released %d lease(s) of a coordinator that is gone: %s",
                        len(released), ", ".join(released))
            self.events.emit("leases_reclaimed", leases=released)

    def _read_metadata(self) -> None:
        """Parse model files' headers once, off the event loop, so estimates are ready."""
        for entry in self.catalog:
            if entry.available:
                try:
                    self.pool.estimate(entry)
                except Exception as exc:  # an unreadable file only loses its "file" rung
                    log.warning("reading metadata of %s failed: %s", entry.path, exc)

    def _preload(self, preload: PreloadEntry) -> None:
        """Load in the background, with the entry's own keep-alive and pin; a failure is
        logged and the server carries on."""
        model_id = self.catalog.get(preload.model).manifest.id
        if preload.keep_alive_s is not None:
            self.pool.kept_warm[model_id] = preload.keep_alive_s
        if preload.pin:
            self.pool.set_pinned(model_id, True)

        def done(task: asyncio.Task) -> None:
            if task.cancelled():
                return
            if task.exception() is not None:
                log.error("preload of '%s' failed: %s", model_id, task.exception())
                self.events.emit("preload_failed", model=model_id,
                                 error=str(task.exception()))
            else:
                self.events.emit("preloaded", model=model_id)

        try:
            self.catalog.get_available(model_id)
        except ModelBossError as exc:
            log.error("preload of '%s' skipped: %s", model_id, exc.message)
            self.events.emit("preload_failed", model=model_id, error=exc.message)
            return
        self.pool.spawn(self.pool.ensure_ready(model_id, self.settings.default_priority)
                        ).add_done_callback(done)

    async def reload(self, trigger: str = "api") -> dict:
        """Read manifests, tasks and the models folder again (see :class:`LiveCatalog`); new
        models' estimates are read off the event loop."""
        answer = await self.live.reload(trigger)
        if answer["added"] or answer["changed"]:
            self._loops = [t for t in self._loops if not t.done()]  # many reloads, few loops
            self._loops.append(asyncio.create_task(asyncio.to_thread(self._read_metadata),
                                                   name="metadata"))
        return answer

    async def stop(self) -> None:
        """Stop taking work, then stop the workers and release the leases. A phase before the
        workers' that has not ended in ``STOP_PHASE_S`` (or that fails) is left behind with
        its stack logged: the workers are stopped and the leases released all the same."""
        await _bounded("the catalog watcher", self.live.stop())
        if self.cluster is not None:  # the others stop sending work here first
            await _bounded("the cluster membership", self.cluster.stop())
        await _bounded("the jobs", self.jobs.shutdown())
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(BaseException):
                await task
        await self.pool.shutdown()
        self.pool.prompt_cache.sweep()  # a save cut short (or still written) leaves nothing
        self.pool.learned.flush()
        self.queue.request_log.close()
        await _bounded("the usage ledger", self.usage.stop())
        await self.runtime.close()
        await self.boss.close(release_held=True)
        self.events.emit("stopped")

    @property
    def exposure_warning(self) -> str | None:
        """What anyone on the network may do here, when this coordinator listens beyond
        loopback without keys (config or managed); None when it does not."""
        return None if self.keys.enforced else exposure_warning(self.settings)

# how long one phase of a stop before the workers' may take (SIGTERM must stop the daemon)
STOP_PHASE_S = 10.0


async def _bounded(phase: str, work: Awaitable[None]) -> None:
    """Await ``work``; if it fails or outlasts ``STOP_PHASE_S``, log where it is and go on."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=STOP_PHASE_S)
    if not done:
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.warning("stopping %s took over %gs; left behind, at:\n%s", phase, STOP_PHASE_S,
                    stack.getvalue().rstrip())
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    elif not task.cancelled() and task.exception() is not None:
        log.error("stopping %s failed", phase, exc_info=task.exception())
