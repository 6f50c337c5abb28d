"""Cluster: one coordinator's part in a cluster of coordinators sharing one Redis.

It owns the membership (heartbeat, view), the forwarder and the load locks, and answers the
one question the serving service asks: where does this request run (:meth:`route`)?
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog
from ..errors import StoreUnavailable
from ..jobs import Job, JobStore, Runner
from ..runtime_config import RuntimeConfig
from ..scheduling.queue import InferenceQueue
from ..settings import Settings
from ..slot_key import model_of, slot_key
from ..slots.pool import ModelPool
from .choice import Here, There, copy_wanted, scale_out, where_cold, where_warm
from .forward import Forwarder
from .jobs import ANY, JobStreams, StreamJobManager
from .membership import Membership
from .records import MemberRecord
from .shared import SharedState
from .store import ClusterStore
from .tenants import SharedTenancy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Route:
    """Where one request runs: ``member`` (None: here) and why. ``loader`` is set when this
    request named the loader of a cold model (it holds the load lock while it runs)."""

    member: MemberRecord | None
    reason: str
    loader: str | None = None
    model: str = ""


class Cluster:
    """Membership, routing and forwarding for one member."""

    def __init__(self, settings: Settings, catalog: Catalog, pool: ModelPool,
                 queue: InferenceQueue, runtime: RuntimeConfig) -> None:
        self.settings = settings
        self.catalog = catalog
        self.pool = pool
        secret = settings.cluster_secret.get_secret_value() if settings.cluster_secret else ""
        self.secret = secret
        self.store = ClusterStore(settings.redis_url)
        self.membership = Membership(settings, self.store, catalog, pool, queue)
        self.forwarder = Forwarder(settings.member_id, secret,
                                   timeout_s=settings.request_timeout_s)
        self.host_id = settings.member_id
        self.shared = SharedState(self.store, self.membership, runtime, pool.learned,
                                  sync_every_s=5 * settings.cluster_heartbeat_s)
        self.tenancy = SharedTenancy(self.store)  # keys and usage, shared
        self.membership.on_notice("keys", lambda notice: self._spawn(
            self.tenancy.keys_changed()))
        self._background: set[asyncio.Task] = set()

    def on_event(self, event: dict) -> None:
        """EventBus listener: slot changes, config changes, new measurements."""
        self.membership.on_event(event)
        self.shared.on_event(event)

    async def start(self) -> None:
        await self.membership.start()
        await self.shared.start()
        self.tenancy.start()

    async def stop(self) -> None:
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task
        await self.tenancy.stop()
        await self.shared.stop()
        await self.membership.stop()
        await self.forwarder.close()
        await self.store.close()

    def job_manager(self, store: JobStore, runner: Runner, *, result_ttl_s: float,
                    max_active: int) -> StreamJobManager:
        """The job manager of a member: jobs on Redis Streams (see :mod:`.jobs`)."""
        streams = JobStreams(self.settings.redis_url, self.host_id,
                             max_jobs=self.settings.max_jobs)
        manager = StreamJobManager(
            store, runner, streams, model_of=self._job_model,
            models=lambda: [e.manifest.id for e in self.catalog if e.available] + [ANY],
            warm_here=self._warm_here, warm_elsewhere=self._warm_elsewhere,
            claim_s=self.settings.cluster_job_claim_s,
            keep_s=self.settings.cluster_heartbeat_s,
            announce_cancel=lambda job_id: self.store.notify("job_cancelled", self.host_id,
                                                             job=job_id),
            result_ttl_s=result_ttl_s, max_active=max_active)
        self.membership.on_notice("job_cancelled", lambda notice: self._spawn(
            manager.cancelled_elsewhere(str(notice.get("job")))))
        return manager

    def _job_model(self, job: Job) -> str:
        model = job.body.get("model")
        entry = self.catalog.find(model) if isinstance(model, str) else None
        return entry.manifest.id if entry is not None else ANY

    def _warm_here(self) -> set[str]:
        """The models with a READY copy here (job streams are named by model)."""
        return {model_of(key) for key, slot in self.pool.slots.items()
                if str(slot.state) == "ready"}

    def _warm_elsewhere(self) -> set[str]:
        """The models with a READY copy on another member."""
        return {model_of(s.model) for host, record in self.membership.view.items()
                if host != self.host_id for s in record.slots if s.state == "ready"}

    # -- routing ------------------------------------------------------------------------

    def _members(self) -> list[MemberRecord]:
        members = dict(self.membership.view)
        members.setdefault(self.host_id, MemberRecord(self.host_id, self.membership.url, ""))
        return list(members.values())

    def _cached(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        """The prompt blocks the choice weighs: none unless routing is cache-aware."""
        return prefix if self.settings.replica_routing == "cache" else ()

    def _replicas_max(self, model_id: str) -> int:
        entry = self.catalog.find(model_id)
        return entry.manifest.replicas.max if entry is not None else 1

    def _copy_wanted(self, model_id: str) -> bool:
        """Whether another member should load one more copy (:func:`copy_wanted`)."""
        return copy_wanted(model_id, self._members(), time.time(),
                           self._replicas_max(model_id), self.settings.replica_scale_wait_s)

    def warm_route(self, model_id: str, prefix: tuple[int, ...] = ()) -> Route | None:
        """The route that the records in memory decide alone: the model is busy or ready
        here, or ready or on its way on some member (READY on several: the one that holds
        most of ``prefix``, the request's prompt blocks, within the load slack). None when
        it is nowhere, or when its copies are full and its requests wait long enough for one
        more (then :meth:`route` names a loader under the load lock)."""
        local = self.pool.slots.get(slot_key(model_id))  # its first copy here
        state = str(local.state) if local is not None else "idle"
        if state not in ("idle", "ready"):
            return Route(None, f"'{model_id}' is {state} here")
        if self._copy_wanted(model_id):
            return None
        return self._warm(model_id, prefix)

    def _warm(self, model_id: str, prefix: tuple[int, ...]) -> Route | None:
        warm = where_warm(model_id, self._members(), self.host_id, self._cached(prefix),
                          self.settings.replica_load_slack)
        if warm is not None:
            return _route(warm)
        local = self.pool.slots.get(slot_key(model_id))
        if local is not None and str(local.state) == "ready":  # our record was older
            return Route(None, f"'{model_id}' is ready here")
        return None

    async def route(self, model_id: str, priority: int, prefix: tuple[int, ...] = ()) -> Route:
        """Where a request for ``model_id`` runs. Warm or on its way somewhere: there. Else
        the cheapest member loads it, named under the model's load lock; a request that
        finds the lock taken goes to the member it names. A model whose copies are all full
        while its requests wait is loaded so too, on a member that holds none
        (:func:`scale_out`), up to its manifest's ``replicas.max``."""
        entry = self.catalog.get_available(model_id)
        known = self.warm_route(model_id, prefix)
        if known is not None:
            return known
        demand = self.pool.demand(entry, priority)
        choice = scale_out(demand, self._members(), self.host_id, time.time(),
                           entry.manifest.replicas.max, self.settings.replica_scale_wait_s)
        if choice is None:  # no copy after all (no member has room): the warm rules
            warm = self._warm(model_id, prefix)
            if warm is not None:
                return warm
            choice = where_cold(demand, self._members(), self.host_id, time.time())
        if not choice.cold:  # no member can take it: this one answers why
            return _route(choice)
        target = choice.member.host_id if isinstance(choice, There) else self.host_id
        try:
            taken, loader = await self.store.take_load(model_id, target,
                                                       self.settings.cluster_load_lock_s)
            if taken:
                # fresh records: the loader before us may have published and let go since
                await self.membership.refresh()
                again = None if self._copy_wanted(model_id) else where_warm(
                    model_id, self._members(), self.host_id, self._cached(prefix),
                    self.settings.replica_load_slack)
                if again is not None:
                    await self.store.keep_load(model_id, target, 0)
                    return _route(again)
                route = _route(choice)
                route.loader, route.model = target, model_id
                return route
        except StoreUnavailable as exc:
            log.warning("cluster: load lock for '%s' unavailable (%s); loading here",
                        model_id, exc.message)
            return Route(None, "Redis unreachable: served here")
        named = self.membership.view.get(loader)
        if loader == self.host_id or named is None:
            return Route(None, f"'{model_id}' is being loaded here" if loader == self.host_id
                         else f"'{model_id}' is being loaded by {loader} (not in view)")
        return Route(named, f"'{model_id}' is being loaded on {loader}")

    @contextlib.asynccontextmanager
    async def holding(self, route: Route) -> AsyncIterator[None]:
        """Keep the load lock ``route`` took while the request runs; after success it lingers
        a heartbeat (the loader's record catches up), after a failure it goes at once."""
        if route.loader is None:
            yield
            return
        lock_s = self.settings.cluster_load_lock_s
        released = asyncio.Event()  # the keeper stops on it even if its cancel is lost
        keeper = asyncio.create_task(self._keep_lock(route, lock_s, released))
        ok = False
        try:
            yield
            ok = True
        finally:
            # nothing awaited here: the request's answer (a stream holding its slot) must
            # reach the caller even if it is cancelled now
            released.set()
            keeper.cancel()
            linger = min(2 * self.settings.cluster_heartbeat_s, lock_s) if ok else 0
            self._spawn(self._let_go(route, linger))

    async def _let_go(self, route: Route, linger_s: float) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.keep_load(route.model, route.loader or "", linger_s)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _keep_lock(self, route: Route, lock_s: float, released: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(lock_s / 3)
            if released.is_set():
                return
            with contextlib.suppress(StoreUnavailable):
                await self.store.keep_load(route.model, route.loader or "", lock_s)

    async def withdraw(self) -> None:
        """A stop has begun: leave the others' view, so they route around this member."""
        await self.membership.withdraw()

    def elsewhere(self, model_id: str, priority: int,
                  prefix: tuple[int, ...] = ()) -> MemberRecord | None:
        """Another member to take a request this one, stopping, will not serve: where the
        model is warm, else the cheapest to load it; None when no other member can."""
        others = [m for m in self.membership.view.values() if m.host_id != self.host_id]
        choice = where_warm(model_id, others, self.host_id, self._cached(prefix),
                            self.settings.replica_load_slack)
        entry = self.catalog.find(model_id)
        if choice is None and others and entry is not None:
            choice = where_cold(self.pool.demand(entry, priority), others, self.host_id,
                                time.time())
        return choice.member if isinstance(choice, There) else None

    def unreachable(self, member: MemberRecord) -> None:
        log.warning("cluster: member %s (%s) unreachable; serving here", member.host_id,
                    member.url)
        self.membership.forget(member.host_id)

    # -- the cluster as a document ------------------------------------------------------

    async def describe(self) -> dict[str, Any]:
        """Members and, per model, where it is and in which tier (a fresh read)."""
        with contextlib.suppress(StoreUnavailable):
            await self.membership.refresh()
        members = sorted(self._members(), key=lambda m: m.host_id)
        now = time.time()
        models: dict[str, list[dict[str, Any]]] = {}
        for member in members:
            for slot in member.slots:
                models.setdefault(slot.model, []).append(
                    {"host_id": member.host_id, "state": slot.state, "tier": slot.tier,
                     "active": slot.active, "queued": slot.queued,
                     "parallel_free": slot.parallel_free})
        return {
            "enabled": True, "host_id": self.host_id,
            "members": [{**m.to_dict(), "age_s": round(max(0.0, now - m.updated_at), 3),
                         "self": m.host_id == self.host_id} for m in members],
            "models": models,
        }


def _route(choice: Here | There) -> Route:
    return Route(choice.member if isinstance(choice, There) else None, choice.reason)
