"""ReplicaRouter: the queue's memory for replica routing (which prefixes and sessions each
replica was sent, in what order replicas were chosen), and the views it builds for the pure
decisions in :mod:`.choice`. A replica whose worker was reloaded starts with an empty index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ...slot_key import SlotKey
from ..states import SlotState
from .choice import ReplicaView, Route, ScaleView, route, scale_up
from .prefixes import BLOCK_CHARS, CHARS_PER_TOKEN, PrefixIndex, Sessions

if TYPE_CHECKING:
    from ...settings import Settings
    from ..seams import SlotGate, SlotReading

ON_THE_WAY = (SlotState.READY, SlotState.LOADING, SlotState.DRAINING)


class QueuedRequest(Protocol):
    """What routing reads of a waiting request (:class:`~..request.QueuedRequest`)."""

    model_id: str
    submitted_at: float
    prefix: tuple[int, ...]
    session: str | None


class ReplicaRouter:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.index = PrefixIndex()
        self.sessions = Sessions()
        self._routed = 0
        self._last: dict[SlotKey, int] = {}  # replica → its place in the round-robin order
        self._loaded: dict[SlotKey, float | None] = {}  # replica → the load its index is of
        self._held: dict[SlotKey, int] = {}  # replica → requests this pass left waiting for it

    def begin_pass(self) -> None:
        """A dispatch pass begins: who waits for which replica is counted afresh."""
        self._held.clear()

    def pick(self, request: QueuedRequest,
             owners: Sequence[SlotGate]) -> tuple[SlotGate | None, Route]:
        """The owner a request goes to now (None: it waits), and the route's reason."""
        if len(owners) == 1:  # the common case: one copy, nothing to choose
            slot = owners[0].slot
            room = slot.state == SlotState.READY and slot.active < slot.entry.manifest.running_limit
            return (owners[0], Route(slot.key, "only replica")) if room else \
                (None, Route(None, "its replica is full"))
        views = [self._view(owner.slot, request) for owner in owners]
        chosen = route(views, session_replica=self.sessions.get(request.session),
                       slack=self.settings.replica_load_slack,
                       policy=self.settings.replica_routing)
        owner = next((o for o in owners if o.slot.key == chosen.key), None)
        if chosen.waits_for is not None:  # its replica's queue, as the next request sees it
            self._held[chosen.waits_for] = self._held.get(chosen.waits_for, 0) + 1
        return owner, chosen

    def granted(self, request: QueuedRequest, slot: SlotReading, chosen: Route) -> None:
        """Remember what ``slot`` was sent (only where the model has, or may have, more than
        one replica, or where another member may forward a conversation's next turn here)."""
        if slot.entry.manifest.replicas.max < 2 and not self.settings.cluster:
            return
        self._fresh(slot)
        self.index.record(slot.key, request.prefix)
        self.sessions.served(request.session, slot.key)
        self._routed += 1
        self._last[slot.key] = self._routed

    def _view(self, slot: SlotReading, request: QueuedRequest) -> ReplicaView:
        self._fresh(slot)
        return ReplicaView(slot.key, str(slot.state), slot.active,
                           slot.entry.manifest.running_limit,
                           self.index.matched(slot.key, request.prefix),
                           self._last.get(slot.key, 0), self._held.get(slot.key, 0))

    def _fresh(self, slot: SlotReading) -> None:
        """A replica loaded again since it was last sent anything holds none of it."""
        if self._loaded.get(slot.key, slot.loaded_at) != slot.loaded_at \
                or slot.state != SlotState.READY:
            self.index.forget(slot.key)
            self.sessions.forget(slot.key)
        self._loaded[slot.key] = slot.loaded_at if slot.state == SlotState.READY else None

    def scale(self, request: QueuedRequest, owners: Sequence[SlotGate], waiting: int,
              now: float) -> bool:
        """Whether the model of ``request`` (the first of its waiters) gets one more
        replica now."""
        manifest = owners[0].slot.entry.manifest
        if manifest.replicas.max < 2:
            return False
        ready = [o.slot for o in owners if o.slot.state == SlotState.READY]
        return scale_up(ScaleView(
            request.model_id,
            replicas=sum(1 for o in owners if o.slot.state in ON_THE_WAY),
            loading=sum(1 for o in owners if o.slot.state == SlotState.LOADING),
            full=bool(ready) and all(s.active >= s.entry.manifest.running_limit
                                     for s in ready),
            waiting=waiting, oldest_wait_s=now - request.submitted_at,
            min_replicas=manifest.replicas.min, max_replicas=manifest.replicas.max),
            self.settings.replica_scale_wait_s)


    def due(self, request: QueuedRequest, owners: Sequence[SlotGate]) -> float | None:
        """When the model of ``request`` may next get a replica for waiting (its first
        waiter's wait reaching the threshold); None when it never can now."""
        manifest = owners[0].slot.entry.manifest
        if sum(1 for o in owners if o.slot.state in ON_THE_WAY) >= manifest.replicas.max:
            return None
        return request.submitted_at + self.settings.replica_scale_wait_s


def cached_prefix_tokens(chosen: Route | None) -> int:
    """The estimate a response header and the request log show."""
    return 0 if chosen is None else chosen.cached_blocks * BLOCK_CHARS // CHARS_PER_TOKEN
