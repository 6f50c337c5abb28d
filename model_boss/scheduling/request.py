"""QueuedRequest: one request waiting for its model; Backlog: the waiting requests, with the
counts the queue reads on every arrival kept as they come and go; SlotTicket: the right to send
a request to a READY slot once granted, released exactly once; Arrivals: requests on their way
into the queue."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..endpoints import IMAGES
from ..errors import BudgetExceeded, CapacityExceeded, ModelBossError
from ..slot_key import SlotKey
from ..tenancy.usage.figures import Figures
from .ordering import Lines, OrderPolicy, Waiter, dealt_ranks
from .replicas import Route
from .seams import SlotReading

log = logging.getLogger(__name__)

@dataclass(eq=False)
class QueuedRequest:
    """One request waiting for its model. ``deadline`` comes from the budget or the wait cap."""

    model_id: str
    priority: int
    client_id: str = "anonymous"
    endpoint: str = ""
    budget_s: float | None = None  # what is left of it when queued
    budget_given_s: float | None = None  # the budget as the client or its task gave it
    keep_alive_s: float | None = None
    max_concurrency: int | None = None
    max_queued: int | None = None  # the client's own limit on waiting requests
    share: float = 1.0  # fair-share weight among clients of equal priority
    rank: float = 0.0  # fair-share rank, fixed when it joins the queue
    submitted_at: float = field(default_factory=time.time)
    deadline: float = 0.0
    request_id: str = field(default_factory=lambda: "req-" + uuid.uuid4().hex[:16])
    task: str | None = None  # the task it came for, and which rung of its ladder this is
    rung: int | None = None
    prompt: str | None = None  # its text, only when the request log captures prompts
    key: str = ""  # the key it came with ("" with no keys configured), for the usage ledger
    end_user: str = ""  # the client id, user or metadata.user_id it named under that key
    # its key's end_user_limits that the queue applies, counted per end user under the key
    end_user_max_concurrency: int | None = None
    end_user_max_queued: int | None = None
    work: float | None = None  # its length as asked (:func:`asked_work`): the wait estimates'
    prefix: tuple[int, ...] = ()  # its prompt's chained block hashes (replica routing)
    session: str | None = None  # what keeps its conversation on one replica
    trace_id: str = ""  # its trace's id where traces are on (the request log's row shows it)
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop()
                                   .create_future())

    @functools.cached_property
    def waiter(self) -> Waiter:
        """What the ordering reads of it; made once, when it is first ordered (its rank is
        fixed on arrival, before)."""
        return Waiter(self.model_id, self.priority, self.client_id, self.submitted_at,
                      self.rank)

    @property
    def end_user_of_key(self) -> tuple[str, str] | None:
        """(key, end user) where it came with a key: what per end user limits count."""
        return (self.key, self.end_user) if self.key else None

    def rerank(self, rank: float) -> None:
        """Give it another fair-share rank (its key's ranks dealt again among its end users);
        the caller takes it out of its line first and puts it back after."""
        self.rank = rank
        self.__dict__.pop("waiter", None)  # made again from the new rank

    def timed_out(self, now: float, max_queue_wait_s: float) -> ModelBossError:
        """The error of a request still waiting at its deadline: its budget ran out, or the
        queue's wait cap did."""
        waited = now - self.submitted_at
        if self.budget_s is not None and self.budget_s <= max_queue_wait_s:
            return BudgetExceeded(
                f"budget of {self.budget_given_s or self.budget_s:g}s for '{self.model_id}' "
                f"ran out after waiting {waited:.1f}s in the queue",
                retry_after_s=max(1.0, self.budget_s))
        return CapacityExceeded(f"'{self.model_id}' could not be scheduled within "
                                f"{waited:.0f}s", retry_after_s=10)


# the body fields that say how long a request may run, by the unit they count in
_TOKENS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def asked_work(endpoint: str, body: dict) -> float | None:
    """A request's length as it asked for it, in its model's unit of work: the tokens it may
    generate, or an image request's steps times its images; None when it does not say."""
    if endpoint == IMAGES:
        steps, images = body.get("steps") or body.get("num_inference_steps"), body.get("n") or 1
        return float(steps * images) if _count(steps) and _count(images) else None
    limit = next((body[name] for name in _TOKENS if _count(body.get(name))), None)
    return float(limit) if limit is not None else None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class Backlog:
    """The waiting requests in arrival order, and their counts by client and priority, by
    model, by model and priority, and by a key's end user: each arrival and departure O(1),
    each count O(1) (a scan of the queue per arrival made a burst of n requests cost n²).

    A keyed request's arrival deals its key's ranks of its priority again among the key's
    end users (:func:`~.ordering.dealt_ranks`): O(its key's waiting), only while more than one
    end user of the key waits, and bounded by the key's queue limit."""

    def __init__(self, policy: OrderPolicy | None = None) -> None:
        self._requests: dict[QueuedRequest, None] = {}  # insertion-ordered
        self.lines = Lines(policy or OrderPolicy())  # each model's, in serving order
        self._by_client: Counter[tuple[str, int]] = Counter()
        self._by_model: Counter[str] = Counter()
        self._by_model_priority: Counter[tuple[str, int]] = Counter()
        self._by_end_user: Counter[tuple[str, str]] = Counter()
        # a key's waiting requests of one priority, in arrival order
        self._of_key: dict[tuple[str, int], dict[QueuedRequest, None]] = {}

    def add(self, request: QueuedRequest) -> None:
        self._requests[request] = None
        if (end_user := request.end_user_of_key) is not None:
            self._by_end_user[end_user] += 1
            group = self._of_key.setdefault((request.client_id, request.priority), {})
            group[request] = None
            if self.lines.policy.fair_share and any(
                    other.end_user != request.end_user for other in group):
                self._deal(group, request)
        self.lines.add(request)
        self._by_client[request.client_id, request.priority] += 1
        self._by_model[request.model_id] += 1
        self._by_model_priority[request.model_id, request.priority] += 1

    def discard(self, request: QueuedRequest) -> bool:
        """Remove ``request``; False when it was not waiting."""
        if self._requests.pop(request, False) is False:
            return False
        self.lines.discard(request)
        counted: list[tuple[Counter, object]] = [
            (self._by_client, (request.client_id, request.priority)),
            (self._by_model, request.model_id),
            (self._by_model_priority, (request.model_id, request.priority))]
        if (end_user := request.end_user_of_key) is not None:
            counted.append((self._by_end_user, end_user))
            group_key = (request.client_id, request.priority)
            group = self._of_key.get(group_key, {})
            group.pop(request, None)
            if not group:
                self._of_key.pop(group_key, None)
        for counter, key in counted:
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        return True

    def _deal(self, group: dict[QueuedRequest, None], arriving: QueuedRequest) -> None:
        """Deal ``group``'s ranks again among its end users; the ones whose rank moved go
        back into their lines (``arriving`` is not in one yet)."""
        requests = list(group)
        dealt = dealt_ranks([r.end_user for r in requests], [r.rank for r in requests])
        for request, rank in zip(requests, dealt, strict=True):
            if rank == request.rank:
                continue
            if request is arriving:
                request.rerank(rank)
                continue
            self.lines.discard(request)
            request.rerank(rank)
            self.lines.add(request)

    def __contains__(self, request: object) -> bool:
        return request in self._requests

    def __iter__(self) -> Iterator[QueuedRequest]:
        return iter(list(self._requests))  # a copy: callers may fail requests as they go

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def of_client(self, client_id: str, priority: int) -> int:
        return self._by_client[client_id, priority]

    def of_end_user(self, key: str, end_user: str) -> int:
        """Waiting of ``end_user`` under ``key`` (any priority)."""
        return self._by_end_user[key, end_user]

    def of_model(self, model_id: str, at_most_priority: int | None = None) -> int:
        """Waiting for ``model_id`` (of priority ≤ ``at_most_priority`` when given)."""
        if at_most_priority is None:
            return self._by_model[model_id]
        return sum(n for (model, priority), n in self._by_model_priority.items()
                   if model == model_id and priority <= at_most_priority)

    def by_model(self) -> dict[str, int]:
        return dict(self._by_model)

    def first_submitted(self) -> dict[str, float]:
        """Per model with waiters, when the one waiting longest came (a scan: for the
        cluster's record, not for every arrival)."""
        first: dict[str, float] = {}
        for request in self._requests:
            if request.submitted_at < first.get(request.model_id, request.submitted_at + 1):
                first[request.model_id] = request.submitted_at
        return first

    def by_priority(self) -> dict[int, int]:
        counts: Counter[int] = Counter()
        for (_model, priority), n in self._by_model_priority.items():
            counts[priority] += n
        return dict(counts)


# the queue's bookkeeping when a ticket is released: (ticket, ok, client_fault)
Released = Callable[["SlotTicket", bool, bool], None]


class SlotTicket:
    """The right to send one request to a READY slot; release it exactly once."""

    def __init__(self, on_release: Released, request: QueuedRequest,
                 slot: SlotReading) -> None:
        self._on_release = on_release
        self.request = request
        self.slot = slot
        self.started = time.monotonic()
        now = time.time()
        self.waited_s = round(now - request.submitted_at, 4)
        # of that wait, the part its model spent loading (a load that ended after it came)
        loaded_at = slot.loaded_at or 0.0
        self.load_wait_s = round(min(now, loaded_at) - request.submitted_at, 4) \
            if loaded_at > request.submitted_at else 0.0
        self.tokens: int | None = None  # generated, as the answer reports them
        self.figures = Figures()  # what the answer told the client it used
        self.status = 200  # the answer's HTTP status, where not 200
        self.metered: int | None = None  # its place on its slot's busy clock (Meter)
        self.load_s = 0.0  # the load it caused, charged to it
        self.settled: list[Callable[[], None]] = []  # told after the release (clean-ups)
        self.route: Route | None = None  # which replica and why, where its model has several
        self._released = False

    def release(self, ok: bool = True, client_fault: bool = False) -> None:
        if self._released:
            return
        self._released = True
        try:
            self._on_release(self, ok, client_fault)
        finally:
            for settled in self.settled:
                try:
                    settled()
                except Exception:  # a clean-up's failure never stops the others
                    log.exception("a request's clean-up failed")


# the gate's "this request reached the queue" for the request served in this context
# (api.middleware.queue_gate sets it; InferenceQueue.acquire calls it)
ARRIVING: ContextVar[Callable[[], None] | None] = ContextVar("arriving", default=None)


class Arrivals:
    """Requests let through the gate that have not reached the queue yet (their bodies are
    being read and parsed), in all and by client: counted against the queue's limits, so a
    burst over them is refused at the gate rather than after each request's parse."""

    def __init__(self) -> None:
        self.total = 0
        self.by_client: Counter[str] = Counter()

    def enter(self, client_id: str | None) -> Callable[[], None]:
        """Count one arrival; the callable returned uncounts it (once, however often called)."""
        self.total += 1
        if client_id:
            self.by_client[client_id] += 1
        left = False

        def leave() -> None:
            nonlocal left
            if left:
                return
            left = True
            self.total -= 1
            if client_id:
                self.by_client[client_id] -= 1
                if self.by_client[client_id] <= 0:
                    del self.by_client[client_id]
        return leave


def yielders(blocking: Collection[SlotKey], priority: int,
             running: Iterable[tuple[SlotKey, int, str]]) -> list[str]:
    """The running work that gives its slot back for a waiting request of ``priority`` whose
    model waits on ``blocking`` (the planner's busy copies it would evict once idle): of
    ``running`` (copy, priority, request id: only work that can yield, a video job), what
    runs on a blocking copy and is less important than the waiter (numerically greater).
    Pure; the caller asks each to yield once."""
    blocked = set(blocking)
    return [request_id for key, running_priority, request_id in running
            if key in blocked and running_priority > priority]


def ask_to_yield(blocking: Collection[SlotKey], priority: int,
                 running: Callable[[SlotKey], Iterable[SlotTicket]],
                 yieldable: dict[str, Callable[[], None]]) -> list[str]:
    """Ask the work :func:`yielders` names to yield (each once: its ask leaves
    ``yieldable``); ``running`` gives a copy's running tickets. The ids asked."""
    candidates = [(ticket.slot.key, ticket.request.priority, ticket.request.request_id)
                  for key in blocking for ticket in running(key)
                  if ticket.request.request_id in yieldable]
    asked = yielders(blocking, priority, candidates)
    for request_id in asked:
        yieldable.pop(request_id)()
    return asked
