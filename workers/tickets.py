"""Admitted requests and their cancellation, by request id (both Python workers).

Every request gets a ``Ticket`` when it is admitted, before it waits for anything; a cancel
marks the ticket of the request it targets, so it holds wherever that request is (queued,
waiting for the model, or running) and it dies with that ticket. Nothing is stored for "the
next request": cancelling every admitted request when none is admitted remembers nothing, and a
cancel for an id that already finished is dropped. A targeted cancel for an id not admitted yet
(the cancel overtook its own request) is remembered for a short while, so that request is
refused when it arrives. The book counts the requests a cancel stopped (``/health`` shows it).

Each worker subclasses ``TicketBook`` to say what its refusals are (its own error classes and
envelope): ``cancelled_error`` (raised by ``Ticket.check``), ``duplicate_error`` (raised by
``open`` for an id already admitted), and ``id_prefix`` (the fresh ids it makes).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Ticket:
    """One admitted request; ``cancel()`` is safe from any thread (its callbacks run on the
    thread that cancels)."""

    request_id: str
    refusal: Callable[[str], Exception] = field(repr=False)  # the error ``check`` raises
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _on_cancel: list[Callable[[], None]] = field(default_factory=list, repr=False)
    cancelled_at: float | None = field(default=None, repr=False)  # monotonic, first cancel

    def cancel(self) -> None:
        if self.cancelled_at is None:
            self.cancelled_at = time.monotonic()
        self._cancelled.set()
        for callback in self._on_cancel:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` at each cancel; at once when a cancel came already."""
        self._on_cancel.append(callback)
        if self.cancelled:
            callback()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise the worker's cancelled error once a cancel has reached this ticket."""
        if self.cancelled:
            raise self.refusal(self.request_id)

    raise_if_cancelled = check  # the diffusers worker's name for it


class CancelOutcome(StrEnum):
    """What a cancel found."""

    CANCELLING = "cancelling"  # admitted: it stops at its next check
    REMEMBERED = "remembered"  # not admitted yet: refused when it arrives
    FINISHED = "finished"  # already over: nothing to do
    NONE = "none"  # untargeted, and nothing is admitted: nothing to do, nothing remembered


class TicketBook:
    """The open tickets by request id, plus early cancels and recently closed ids (both
    bounded), and how many requests a cancel stopped. Thread-safe; never blocks on anything
    but its own short lock (tickets are marked, and their callbacks run, outside it)."""

    id_prefix = "req"

    def __init__(self, *, remember_s: float = 60.0, remember_max: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._open: dict[str, Ticket] = {}
        self._early: OrderedDict[str, float] = OrderedDict()  # request id -> when cancelled
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._remember_s, self._remember_max, self._clock = remember_s, remember_max, clock
        self._lock = threading.Lock()
        self.cancelled = 0  # requests a cancel stopped (``close(..., stopped=True)``)
        self.last_cancelled: str | None = None
        self.last_stop_ms: float | None = None  # from its cancel to its stop, the last one

    def cancelled_error(self, request_id: str) -> Exception:
        """What ``Ticket.check`` raises once the request is cancelled."""
        return RuntimeError(f"request {request_id} was cancelled")

    def duplicate_error(self, request_id: str) -> Exception:
        """What ``open`` raises for an id already admitted."""
        return ValueError(f"a request with request_id {request_id!r} is already admitted")

    def open(self, request_id: str | None = None) -> Ticket:
        """A ticket for a new request (a fresh id when none is given); already cancelled when
        a cancel for its id came first."""
        rid = request_id or f"{self.id_prefix}-{uuid.uuid4().hex[:16]}"
        with self._lock:
            if rid in self._open:
                raise self.duplicate_error(rid)
            self._expire_early()
            ticket = Ticket(rid, self.cancelled_error)
            if self._early.pop(rid, None) is not None:
                ticket.cancel()  # no callbacks yet
            self._open[rid] = ticket
            self._closed.pop(rid, None)
            return ticket

    def close(self, ticket: Ticket, *, stopped: bool = False) -> None:
        """The request is over (done, failed or cancelled): its cancels end here;
        ``stopped``: a cancel ended it (counted and logged)."""
        with self._lock:
            if self._open.get(ticket.request_id) is ticket:
                del self._open[ticket.request_id]
                self._closed[ticket.request_id] = None
                while len(self._closed) > self._remember_max:
                    self._closed.popitem(last=False)
            stop_ms = None
            if stopped:
                self.cancelled += 1
                self.last_cancelled = ticket.request_id
                if ticket.cancelled_at is not None:
                    stop_ms = round((time.monotonic() - ticket.cancelled_at) * 1000, 1)
                self.last_stop_ms = stop_ms
        if stopped:
            log.info("request %s cancelled (stopped %s ms after its cancel came)",
                     ticket.request_id, stop_ms)

    def cancel(self, request_id: str) -> CancelOutcome:
        """Cancel one request by id, admitted or not yet."""
        with self._lock:
            ticket = self._open.get(request_id)
            if ticket is None:
                return self._remember(request_id)
        ticket.cancel()
        return CancelOutcome.CANCELLING

    def cancel_open(self) -> list[str]:
        """Cancel every admitted request (queued or running); remembers nothing."""
        with self._lock:
            found = list(self._open.values())
        for ticket in found:
            ticket.cancel()
        return [ticket.request_id for ticket in found]

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def _remember(self, request_id: str) -> CancelOutcome:
        """A cancel for an id not open (under the lock): dropped when it finished already,
        else kept for its request."""
        if request_id in self._closed:
            return CancelOutcome.FINISHED
        self._expire_early()
        self._early[request_id] = self._clock()
        self._early.move_to_end(request_id)
        while len(self._early) > self._remember_max:
            self._early.popitem(last=False)
        return CancelOutcome.REMEMBERED

    def _expire_early(self) -> None:
        horizon = self._clock() - self._remember_s
        while self._early and next(iter(self._early.values())) < horizon:
            self._early.popitem(last=False)
