"""InferenceQueue: who runs next. Lower priority number = more important.

The order is :func:`~.ordering.serving_order` (aging, fair share among clients, warm grouping;
docs/SCHEDULING.md): the same function the trace simulator replays. A request whose model
cannot load yet waits without blocking requests for other models; once it is first in order,
the models it waits for take no new requests until they are idle and can make room. Loads
and evictions are planned with the request's aged priority, so a long wait may evict an idle
model a more important client used. Limits: ``max_concurrency`` (the rest wait), ``max_queued``
per model, client and in all (429). The loop wakes on every arrival, release, and every 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterator

from ..errors import BudgetExceeded, CapacityExceeded, ModelBossError, ModelUnavailable
from ..events import EventBus
from ..gpu.placement import partial_layers
from ..settings import Settings
from ..slot_key import SlotKey, slot_key
from ..tenancy.usage import Meter
from .budget import Admission, admit
from .ordering import OrderPolicy, effective_priority, fair_rank
from .planner import Evict, Never, Wait
from .replicas import ReplicaRouter, Route
from .request import ARRIVING, Arrivals, Backlog, QueuedRequest, SlotTicket, ask_to_yield
from .request_log import RequestLog
from .requestors import RequestorRegistry
from .seams import SlotBoard, SlotGate
from .states import SlotState

log = logging.getLogger(__name__)

WAKE_INTERVAL_S = 5.0
MIN_WARM_CREDIT_S = 1.0  # a loaded model's requests group even before its load was timed


class InferenceQueue(Admission):
    """Grants slots to requests in priority order and starts loads when they can fit."""

    def __init__(self, pool: SlotBoard, settings: Settings, events: EventBus) -> None:
        self.pool = pool
        self.settings = settings
        self.events = events
        self.requestors = RequestorRegistry()
        self.meter = Meter(settings.member_id if settings.cluster else "")  # GPU-seconds
        self.request_log = RequestLog(settings.state_path / "requests.jsonl"
                                      if settings.request_log else None)
        self.order_policy = OrderPolicy(aging_s=settings.aging_s,
                                        fair_share=settings.fair_share,
                                        turn_s=settings.fair_share_turn_s)
        self._pending = self.backlog = Backlog(self.order_policy)  # read-only outside
        self.arrivals = Arrivals()  # let through the gate, not queued yet
        # (deadline, arrival, request): the next to time out without a scan (stale entries
        # are dropped as they come to the top)
        self._deadlines: list[tuple[float, int, QueuedRequest]] = []
        self._arrivals = itertools.count()
        # the requests whose model could not load yet at the last pass: their aging may
        # change that, so the loop wakes when one of them reaches its next level
        self._planners: list[QueuedRequest] = []
        self._scale_due: float | None = None  # when a waiter will have waited long enough
        self._wake = asyncio.Event()
        self._held = False
        self._in_flight_by_client: dict[str, int] = {}
        self._in_flight_by_end_user: dict[tuple[str, str], int] = {}  # (key, end user)
        self._evicting: dict[SlotKey, tuple[SlotKey, ...]] = {}  # loading copy -> its victims
        # request id -> how to ask it to give its slot back (a video job: it is requeued)
        self.yieldable: dict[str, Callable[[], None]] = {}
        self.granted_total = 0
        self.replicas = ReplicaRouter(settings)
        self.on_granted: Callable[[int, float], None] = lambda priority, waited_s: None
        pool.on_change = self.wake
        pool.wanted = self.wanted_models

    @property
    def depth(self) -> int:
        return len(self._pending)

    def wake(self) -> None:
        if not self._held:  # a release decides itself (it may hand its slot on)
            self._wake.set()

    async def acquire(self, request: QueuedRequest) -> SlotTicket:
        """Queue ``request`` and wait for a slot. Cancelling the caller dequeues it."""
        planned = await self.planned(request) if request.budget_s is not None else None
        if (arrived := ARRIVING.get()) is not None:
            arrived()  # from here on it counts as queued, or is refused
        cooldown = self.requestors.cooldown_left(request.model_id)
        if cooldown > 0:  # the model's own failures, whoever asked; a task falls back
            raise ModelUnavailable(f"'{request.model_id}' is cooling down after repeated "
                                   f"worker failures", retry_after_s=cooldown,
                                   code="model_cooling_down")
        self._check_limits(request)
        if request.budget_s is not None:
            decision = admit(request.budget_s, self.predict(request, planned),
                             request.budget_given_s)
            if not decision.admitted:
                self.requestors.get(request.client_id).rejected += 1
                self.events.emit("budget_refused", model=request.model_id,
                                 client=request.client_id, reason=decision.reason)
                raise BudgetExceeded(f"'{request.model_id}': {decision.reason}",
                                     retry_after_s=decision.retry_after_s)
        wait_cap = self.settings.max_queue_wait_s
        if request.budget_s is not None:
            wait_cap = min(wait_cap, request.budget_s)
        request.deadline = request.submitted_at + wait_cap
        request.rank = fair_rank(self._pending.of_client(request.client_id, request.priority),
                                 request.share)
        self._pending.add(request)
        heapq.heappush(self._deadlines, (request.deadline, next(self._arrivals), request))
        self.requestors.submitted(request.client_id)
        if self._grant_head(request.model_id) and request.future.done():
            return request.future.result()  # first in order, its READY slot has room
        waiting_on: SlotGate | None = None  # it is one waiter of its model's load
        with contextlib.suppress(ModelBossError):  # an unknown model fails in dispatch
            waiting_on = self.pool.owner(request.model_id)
            waiting_on.wait_begins()
        gave_up = False
        self.wake()
        try:
            return await request.future
        except asyncio.CancelledError:
            gave_up = True
            if request.future.done() and not request.future.cancelled():
                with contextlib.suppress(BaseException):
                    request.future.result().release(ok=False, client_fault=True)
            self.events.emit("request_cancelled", model=request.model_id,
                             client=request.client_id)
            raise
        finally:
            if self._pending.discard(request):
                self.requestors.dequeued(request.client_id)
                self.wake()
            if waiting_on is not None:  # the last to give up cancels a load nobody wants
                waiting_on.wait_ends(gave_up)

    def in_order(self) -> Iterator[QueuedRequest]:
        """The waiting requests in serving order, lazily: a page of them costs its length."""
        return iter(self._pending.lines.walk(self._warm_credits()))

    def ordered(self) -> list[QueuedRequest]:
        """The waiting requests in serving order (read-only; one order for everyone):
        :func:`~.ordering.serving_order`'s, from the models' lines (:class:`~.ordering.Lines`)."""
        return list(self.in_order())

    def _warm_credits(self) -> dict[str, float]:
        """Loaded models → the reload seconds serving them now saves (warm grouping)."""
        credits = {}
        for slot in self.pool.slots.values():  # a model's replicas: one credit
            if slot.state == SlotState.READY:
                model_id = slot.model_id
                size = slot.estimate.mb if slot.estimate else 0
                credits[model_id] = max(MIN_WARM_CREDIT_S,
                                        self.pool.learned.predicted_load_s(model_id, size))
        return credits

    def wanted_models(self) -> tuple[str, ...]:
        """The models waiting requests need, in serving order (look-ahead eviction)."""
        return tuple(self._pending.lines.models(self._warm_credits()))

    def aged_priority(self, request: QueuedRequest, now: float | None = None) -> int:
        now = time.time() if now is None else now
        return effective_priority(request.priority, now - request.submitted_at,
                                  self.order_policy)

    def _grant(self, request: QueuedRequest, owner: SlotGate, route: Route | None = None,
               ) -> bool:
        """Grant ``request`` a place on ``owner``'s slot if the owner agrees (READY, leased,
        alive, room); the check and the count happen with no await between them."""
        if not owner.try_acquire(request.priority, request.keep_alive_s):
            return False
        client, slot = request.client_id, owner.slot
        if route is not None:
            self.replicas.granted(request, slot, route)
        self._in_flight_by_client[client] = self._in_flight_by_client.get(client, 0) + 1
        if (end_user := request.end_user_of_key) is not None:
            self._in_flight_by_end_user[end_user] = \
                self._in_flight_by_end_user.get(end_user, 0) + 1
        self._pending.discard(request)
        self.requestors.started(client)
        self.granted_total += 1
        self.pool.rates.record(request.model_id, time.time())
        ticket = SlotTicket(self._finished, request, slot)
        ticket.route = route
        self.meter.granted(ticket)
        self.on_granted(request.priority, ticket.waited_s)
        request.future.set_result(ticket)
        return True

    def _finished(self, ticket: SlotTicket, ok: bool, client_fault: bool) -> None:
        slot, request = ticket.slot, ticket.request
        unloads = slot.unload_after_request and not slot.pinned  # keep_alive 0: it goes now
        self._held = True
        try:
            owner = self.pool.owners.get(slot.key) or self.pool.owner(slot.model_id)
            owner.release(request.priority, request.keep_alive_s)
        finally:
            self._held = False
        duration = time.monotonic() - ticket.started
        if ok:
            self.pool.learned.observe_inference(
                slot.model_id, duration, request.work,
                partial_layers(slot.placement, slot.entry.manifest.gpu_layers))
        self.request_log.finished(ticket, ok, duration, self.pool.learned.get(slot.model_id).load_s)
        self.meter.finished(ticket, ok, client_fault, duration)
        client = request.client_id
        self._in_flight_by_client[client] = max(0, self._in_flight_by_client.get(client, 1) - 1)
        if (end_user := request.end_user_of_key) is not None:
            left = self._in_flight_by_end_user.get(end_user, 1) - 1
            if left > 0:
                self._in_flight_by_end_user[end_user] = left
            else:
                self._in_flight_by_end_user.pop(end_user, None)
        self.requestors.finished(client, slot.model_id, ok, time.monotonic() - ticket.started,
                                 client_fault=client_fault)
        if unloads or not self._grant_head(slot.model_id) \
                or slot.active < slot.entry.manifest.running_limit:  # else: full again, as was
            self.wake()

    def _grant_head(self, model_id: str) -> bool:
        """Grant the first waiter in order now when it is ``model_id``'s and its READY slot
        has room, as the next pass would first; anything else is left to the pass."""
        head = self._pending.lines.head(self._warm_credits())
        if head is None or head.model_id != model_id or head.future.done() \
                or time.time() >= head.deadline:
            return False
        draining = {key for victims in self._evicting.values() for key in victims}
        owners = [o for o in self.pool.replicas(model_id) if o.slot.key not in draining]
        owner, route = self.replicas.pick(head, owners) if owners else (None, None)
        if owner is None:
            return False
        return self._has_room(head, owner) and self._grant(head, owner, route)

    def _fail(self, request: QueuedRequest, error: ModelBossError) -> None:
        self._pending.discard(request)
        self.requestors.dequeued(request.client_id, rejected=True)
        if not request.future.done():
            request.future.set_exception(error)

    def _has_room(self, request: QueuedRequest, owner: SlotGate) -> bool:
        """The client is under its concurrency, its end user under the key's
        ``end_user_limits``, and the model under its ``max_concurrency``."""
        if owner.slot.active >= owner.slot.entry.manifest.running_limit:
            return False
        end_user = request.end_user_of_key
        if end_user is not None and request.end_user_max_concurrency is not None and \
                self._in_flight_by_end_user.get(end_user, 0) >= request.end_user_max_concurrency:
            return False
        if request.max_concurrency is None:
            return True
        return self._in_flight_by_client.get(request.client_id, 0) < request.max_concurrency

    def _expire(self, now: float) -> None:
        """Fail the waiting requests whose deadline has passed (from the deadline heap)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, request = heapq.heappop(self._deadlines)
            if request in self._pending and not request.future.done():
                self._fail(request, request.timed_out(now, self.settings.max_queue_wait_s))

    def _next_deadline(self) -> float | None:
        while self._deadlines and self._deadlines[0][2] not in self._pending:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    async def dispatch(self) -> None:
        """One pass over the waiting requests, most important first."""
        now = time.time()
        self._expire(now)
        # slots a waiter ahead needs to go idle, and those a load under way is evicting
        draining: set[SlotKey] = {key for victims in self._evicting.values() for key in victims}
        self._planners, self._scale_due = [], None
        self.replicas.begin_pass()
        scaled: set[str] = set()  # models asked for one more replica in this pass
        # a model leaves the walk once nothing more of it can be served in this pass: the
        # same requests the pass skipped one by one before
        walk = self._pending.lines.walk(self._warm_credits())
        for request in walk:
            if request.future.done():
                continue
            if now >= request.deadline:
                self._fail(request, request.timed_out(now, self.settings.max_queue_wait_s))
                continue
            try:
                owner = self.pool.owner(request.model_id)
            except ModelBossError as exc:
                self._fail(request, exc)
                continue
            owners = self.pool.replicas(request.model_id)
            ready = [o for o in owners if o.slot.state == SlotState.READY
                     and o.slot.key not in draining]
            if ready:
                await self._scale(request, owners, now, scaled)
                # read again after the await: a copy may have left READY meanwhile (the grant
                # is the owner's to refuse either way)
                ready = [o for o in ready if o.slot.state == SlotState.READY]
                if not ready:
                    continue
                chosen, route = self.replicas.pick(request, ready)
                if chosen is None:  # full, or it waits for the replica with its prefix
                    if route.key is None and not route.reason.startswith("waits"):
                        walk.drop(request.model_id)
                elif self._has_room(request, chosen) and \
                        not self._grant(request, chosen, route):
                    walk.drop(request.model_id)  # the owner refused: full, or leaving READY
                continue
            walk.drop(request.model_id)  # its first waiter in order speaks for the rest
            if any(o.slot.state not in (SlotState.IDLE, SlotState.OFFLOADED)
                   or self.pool.is_loading(o.slot.key) for o in owners):
                continue  # a replica is on its way, or leaving
            priority = self.aged_priority(request, now)
            try:
                decision = await self.pool.plan(slot_key(request.model_id), priority)
            except ModelBossError as exc:
                self._fail_model(request.model_id, exc)
                continue
            if isinstance(decision, Never):
                self._fail_model(request.model_id,
                                 CapacityExceeded(decision.reason, retry_after_s=30))
            elif isinstance(decision, Wait):
                self._planners.append(request)
                draining.update(decision.blocking)  # less important long work yields to it
                ask_to_yield(decision.blocking, priority, self.meter.running, self.yieldable)
            else:  # the owner joins a load already in flight instead of starting a second
                task = owner.start_load(priority)
                if task is not None and isinstance(decision, Evict):
                    # no new grants on what this load evicts until it is done
                    self._evicting[owner.slot.key] = decision.victims
                    draining.update(decision.victims)
                if task is not None:
                    task.add_done_callback(
                        lambda t, key=owner.slot.key, model=request.model_id:
                        self._load_done(key, t, model))

    async def _scale(self, request: QueuedRequest, owners: list[SlotGate], now: float,
                     scaled: set[str]) -> None:
        """One more replica of the request's model where its waiters are worth one and a GPU
        has room (evicting only what the planner lets this request's priority evict)."""
        model_id = request.model_id
        if model_id in scaled:
            return
        if not self.replicas.scale(request, owners, self._pending.of_model(model_id), now):
            due = self.replicas.due(request, owners)  # releases grant without a pass: wake
            if due is not None and due > now:
                self._scale_due = min(due, self._scale_due or due)
            return
        scaled.add(model_id)
        owner = self.pool.add_replica(model_id)
        priority = self.aged_priority(request, now)
        try:
            decision = await self.pool.plan(owner.slot.key, priority)
        except ModelBossError:
            decision = None
        if decision is None or not decision.can_start:
            self.pool.prune_replicas()
            return
        task = owner.start_load(priority)
        if task is None:
            return
        self.events.emit("replica_added", model=model_id, replica=owner.slot.key,
                         waited_s=round(now - request.submitted_at, 3))
        if isinstance(decision, Evict):
            self._evicting[owner.slot.key] = decision.victims
        task.add_done_callback(lambda t, key=owner.slot.key: self._load_done(key, t, None))

    def _load_done(self, key: SlotKey, task: asyncio.Task, model_id: str | None) -> None:
        """The load of the copy ``key`` ended. A failure fails the waiters of ``model_id``
        (None: a replica's load, whose model's waiters the copies serving it keep)."""
        if self._evicting.pop(key, None):
            self.wake()
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, CapacityExceeded):
            if model_id is not None:
                self._fail_model(model_id, exc if isinstance(exc, ModelBossError)
                                 else CapacityExceeded(str(exc)))
        elif not task.cancelled():
            self.wake()  # loaded, or lost a race for room: the waiters stay and retry

    def _fail_model(self, model_id: str, error: ModelBossError) -> None:
        for request in [r for r in self._pending if r.model_id == model_id]:
            self._fail(request, error)

    async def run(self) -> None:
        """The dispatch loop. Never dies."""
        while True:
            try:  # asyncio.timeout, not wait_for: wait_for can swallow a cancel in 3.11
                async with asyncio.timeout(WAKE_INTERVAL_S):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.dispatch()
            except Exception:
                log.exception("queue dispatch failed; carrying on")
            deadline = self._next_deadline()
            if deadline is not None:
                # deadlines must fire even when nothing else happens, and so must aging: a
                # waiter whose model waits for room may, at its next level, evict what it could
                # not before (aging changes nothing else: the serving order is fixed by it)
                now = time.time()
                nearest = deadline - now
                aging = self.order_policy.aging_s
                planners = [r for r in self._planners if r in self._pending]
                if aging > 0 and planners:
                    nearest = min(nearest, min(aging - (now - r.submitted_at) % aging
                                               for r in planners) + 0.01)
                if self._scale_due is not None:
                    nearest = min(nearest, self._scale_due - now + 0.01)
                if nearest < WAKE_INTERVAL_S:
                    asyncio.get_running_loop().call_later(max(0.01, nearest), self.wake)
