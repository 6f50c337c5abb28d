"""Requests by id, and their cancellation (``POST /cancel``).

Every model request gets a ``Ticket`` when it arrives (its ``request_id``, or a fresh one); a
cancel marks it, whether it waits for the model, waits in the batcher, or runs: a
transcription stops at its next chunk (the model's next forward), speech at its next sentence,
and an embedding or rerank request still queued in the batcher leaves the queue (a batch
already running is short and runs out; that request's share is dropped). A cancel that
overtakes its own request is remembered a short while, so that request is refused when it
arrives. A cancel for an id already finished does nothing.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import WorkerError

log = logging.getLogger(__name__)


class Cancelled(WorkerError):
    def __init__(self, request_id: str) -> None:
        super().__init__(409, f"request {request_id} was cancelled", "cancelled")


@dataclass(eq=False)
class Ticket:
    """One admitted request; ``cancel()`` is safe from the event loop's thread."""

    request_id: str
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _on_cancel: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def cancel(self) -> None:
        self._cancelled.set()
        for callback in self._on_cancel:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        self._on_cancel.append(callback)
        if self.cancelled:
            callback()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise ``Cancelled`` once a cancel has reached this ticket."""
        if self.cancelled:
            raise Cancelled(self.request_id)


class Tickets:
    """The open tickets by request id, plus early cancels and recently closed ids (both
    bounded), and what was cancelled (``/health`` shows it)."""

    def __init__(self, remember_s: float = 60.0, remember_max: int = 256) -> None:
        self._open: dict[str, Ticket] = {}
        self._early: OrderedDict[str, float] = OrderedDict()
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._remember_s, self._remember_max = remember_s, remember_max
        self._lock = threading.Lock()
        self.cancelled = 0  # requests stopped by a cancel
        self.last_cancelled: str | None = None

    def open(self, request_id: str | None) -> Ticket:
        rid = request_id or f"req-{uuid.uuid4().hex[:16]}"
        with self._lock:
            if rid in self._open:
                raise WorkerError(409, f"a request with request_id {rid!r} is already "
                                  "running", "duplicate_request_id", "request_id")
            horizon = time.monotonic() - self._remember_s
            while self._early and next(iter(self._early.values())) < horizon:
                self._early.popitem(last=False)
            ticket = Ticket(rid)
            if self._early.pop(rid, None) is not None:
                ticket.cancel()
            self._open[rid] = ticket
            return ticket

    def close(self, ticket: Ticket, *, stopped: bool = False) -> None:
        """The request is over; ``stopped``: a cancel ended it."""
        with self._lock:
            if self._open.get(ticket.request_id) is ticket:
                del self._open[ticket.request_id]
                self._closed[ticket.request_id] = None
                while len(self._closed) > self._remember_max:
                    self._closed.popitem(last=False)
            if stopped:
                self.cancelled += 1
                self.last_cancelled = ticket.request_id
        if stopped:
            log.info("request %s cancelled", ticket.request_id)

    def cancel(self, request_id: str | None) -> dict[str, object]:
        """Cancel one request by id (admitted or not yet), or every open one (no id)."""
        with self._lock:
            if request_id is None:
                found, outcome = list(self._open.values()), "cancelling"
            elif request_id in self._open:
                found, outcome = [self._open[request_id]], "cancelling"
            elif request_id in self._closed:
                found, outcome = [], "finished"
            else:
                found, outcome = [], "remembered"
                self._early[request_id] = time.monotonic()
                while len(self._early) > self._remember_max:
                    self._early.popitem(last=False)
        for ticket in found:
            ticket.cancel()
        return {"request_id": request_id, "outcome": outcome,
                "cancelled": [t.request_id for t in found]}

    def running(self) -> list[str]:
        with self._lock:
            return list(self._open)
