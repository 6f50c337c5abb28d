"""Membership: this coordinator's heartbeat and its view of the others.

Every ``cluster_heartbeat_s`` (and at once after a change of any slot) the member writes its
record with a TTL of ``cluster_member_ttl_s``; after a change it also sends a notice, and
every member that hears one re-reads the records. Each beat re-reads them all too, so a lost
notice (Redis restarting) costs at most one beat. A Redis restart without persistence is
repaired by the next beat: the record and the set come back.

Routing reads :attr:`Membership.view` only: no Redis round trip on the request path.

A record carries, per model READY here, the prompt blocks its replicas were sent last (at
most :data:`PUBLISHED_BLOCKS`): what the others forward a conversation's next turn by. They
go with the record, so a member that dies takes them out of the others' view with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .. import __version__
from ..catalog import Catalog
from ..errors import StoreUnavailable
from ..scheduling.queue import InferenceQueue
from ..settings import Settings
from ..slot_key import SlotKey
from ..slots.pool import ModelPool
from .records import MemberRecord, SlotRecord
from .store import ClusterStore, Notice

log = logging.getLogger(__name__)

# events after which the others should hear about this member's slots at once
SLOT_EVENTS = frozenset({"slot_state", "loaded", "evicted", "offloaded", "onloaded",
                         "lease_lost", "pinned", "unpinned"})
PUBLISHED_BLOCKS = 512  # per model, shared among its READY replicas here


class Membership:
    """Publishes this member; keeps the view of every member current."""

    withdrawn = False  # a stop has begun: the record is gone, the view still kept

    def __init__(self, settings: Settings, store: ClusterStore, catalog: Catalog,
                 pool: ModelPool, queue: InferenceQueue) -> None:
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.pool = pool
        self.queue = queue
        self.host_id = settings.member_id
        self.url = settings.member_url
        self.started_at = time.time()
        self.view: dict[str, MemberRecord] = {}
        self.beats = 0
        self._changed = asyncio.Event()
        self._refresh = asyncio.Event()
        # set before the loops are cancelled: a cancel that lands as a Redis command ends can
        # be lost (redis-py sends under asyncio.wait_for), and a loop must end anyway
        self._stopping = asyncio.Event()
        self._notice_handlers: dict[str, list[Callable[[Notice], None]]] = {}
        self._tasks: list[asyncio.Task] = []

    # -- what this member is ------------------------------------------------------------

    async def record(self) -> MemberRecord:
        snap = await self.pool.snapshot()
        queued = self.queue.backlog.by_model()
        since = self.queue.backlog.first_submitted()
        now = time.time()
        slots = []
        for view in snap.slots:
            slot = self.pool.slots.get(view.key)
            if slot is None or view.state == "idle":
                continue
            slots.append(SlotRecord(
                model=view.key, state=view.state, tier=slot.tier, active=view.active,
                queued=queued.get(slot.model_id, 0), parallel=slot.parallel,
                pinned=view.pinned, last_used=view.last_used,
                last_priority=view.last_priority, unload_at=view.unload_at,
                allocations=dict(view.allocations), reload_s=view.reload_s,
                rate_per_s=view.rate_per_s,
                oldest_wait_s=round(max(0.0, now - since[slot.model_id]), 3)
                if slot.model_id in since else 0.0))
        return MemberRecord(
            host_id=self.host_id, url=self.url, version=__version__,
            gpus=tuple(g.to_dict() for g in self.pool.boss.gpus),
            free_mb=dict(snap.free_mb), ceiling_mb=dict(snap.ceiling_mb),
            models=tuple(e.manifest.id for e in self.catalog if e.available),
            slots=tuple(slots), queue_depth=self.queue.depth,
            started_at=self.started_at, updated_at=time.time(), prefixes=self.prefixes())

    def prefixes(self) -> dict[str, tuple[int, ...]]:
        """Per model READY here, the block hashes its replicas were sent most recently: each
        replica's last ``PUBLISHED_BLOCKS / replicas``, together."""
        ready: dict[str, list[SlotKey]] = {}  # model -> its READY copies
        for slot in self.pool.slots.values():
            if str(slot.state) == "ready":
                ready.setdefault(slot.model_id, []).append(slot.key)
        index = self.queue.replicas.index
        published = {}
        for model, keys in ready.items():
            share = max(1, PUBLISHED_BLOCKS // len(keys))
            blocks = dict.fromkeys(b for key in sorted(keys) for b in index.summary(key, share))
            if blocks:
                published[model] = tuple(blocks)
        return published

    # -- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Register (a Redis that cannot be reached is retried by the heartbeat) and start
        the heartbeat and the notice listener."""
        with contextlib.suppress(StoreUnavailable):
            await self.publish(notify=True)
            await self.refresh()
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name="cluster-heartbeat"),
            asyncio.create_task(self.store.listen(self._on_notice, until=self._stopping),
                                name="cluster-notices"),
        ]

    async def stop(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(StoreUnavailable):
            await self.store.leave(self.host_id)
            await self.store.notify("left", self.host_id)

    async def withdraw(self) -> None:
        """Leave the others' view now (a stop has begun): the record is deleted, the others
        told, and no beat writes it again; this member still reads theirs."""
        self.withdrawn = True
        with contextlib.suppress(StoreUnavailable):
            await self.store.leave(self.host_id)
            await self.store.notify("left", self.host_id)

    def on_event(self, event: dict) -> None:
        """EventBus listener: a slot changed, so publish before the next beat."""
        if event.get("type") in SLOT_EVENTS:
            self._changed.set()

    def on_notice(self, kind: str, handler: Callable[[Notice], None]) -> None:
        """Also call ``handler`` for notices of ``kind`` from other members."""
        self._notice_handlers.setdefault(kind, []).append(handler)

    def forget(self, host_id: str) -> None:
        """Drop a member that could not be reached until its record says otherwise."""
        if host_id != self.host_id:
            self.view.pop(host_id, None)

    # -- the loops ----------------------------------------------------------------------

    async def publish(self, notify: bool = False) -> MemberRecord:
        record = await self.record()
        await self.store.register(record, self.settings.cluster_member_ttl_s)
        self.view[self.host_id] = record
        if notify:
            await self.store.notify("slots", self.host_id)
        return record

    async def refresh(self) -> None:
        records = {r.host_id: r for r in await self.store.members()}
        own = self.view.get(self.host_id)
        if own is not None:  # our own record in memory is never older than Redis's copy
            records[self.host_id] = own
        self.view = records

    async def _heartbeat(self) -> None:
        interval = self.settings.cluster_heartbeat_s
        while not self._stopping.is_set():
            waits = [asyncio.create_task(event.wait())
                     for event in (self._changed, self._refresh, self._stopping)]
            try:
                await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
            if self._stopping.is_set():
                return
            changed = self._changed.is_set()
            self._changed.clear()
            self._refresh.clear()
            try:
                if not self.withdrawn:
                    await self.publish(notify=changed)
                await self.refresh()
                self.beats += 1
            except StoreUnavailable as exc:
                log.warning("cluster heartbeat failed: %s", exc.message)
            except Exception:  # the heartbeat never dies
                log.exception("cluster heartbeat failed")

    def _on_notice(self, notice: Notice) -> None:
        if notice.get("host") == self.host_id:
            return
        kind = str(notice.get("kind"))
        if kind in ("slots", "left"):
            self._refresh.set()
        for handler in self._notice_handlers.get(kind, ()):
            handler(notice)
