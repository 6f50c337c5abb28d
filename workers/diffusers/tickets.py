"""Admitted generations and their cancellation, by request id.

Every generation gets a ``Ticket`` when it is admitted, before it waits for anything; a cancel
marks the ticket of the generation it targets, so it holds whether the generation is queued,
not yet denoising, or mid-loop, and it dies with that ticket. Nothing is stored for "the next
generation": an untargeted cancel with nothing admitted does nothing, and a cancel for an id
that already finished is dropped. A targeted cancel for an id not admitted yet (the cancel
overtook its own ``/generate``) is remembered for a short while, so that generation is refused
when it arrives.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from .errors import Cancelled, DuplicateRequestId


@dataclass(eq=False)
class Ticket:
    """One admitted generation; ``cancel()`` is safe from any thread."""

    request_id: str
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` once a cancel has reached this ticket."""
        if self.cancelled:
            raise Cancelled(f"generation {self.request_id} cancelled")


class CancelOutcome(StrEnum):
    """What a cancel found."""

    CANCELLING = "cancelling"  # admitted: it stops at its next check
    REMEMBERED = "remembered"  # not admitted yet: refused when it arrives
    FINISHED = "finished"  # already over: nothing to do
    NONE = "none"  # untargeted, and nothing is admitted: nothing to do, nothing remembered


class TicketBook:
    """The open tickets by request id, plus early cancels and recently closed ids (both
    bounded). Thread-safe; never blocks on anything but its own short lock."""

    def __init__(self, *, remember_s: float = 60.0, remember_max: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._open: dict[str, Ticket] = {}
        self._early: OrderedDict[str, float] = OrderedDict()  # request id -> when cancelled
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._remember_s, self._remember_max, self._clock = remember_s, remember_max, clock
        self._lock = threading.Lock()

    def open(self, request_id: str | None = None) -> Ticket:
        """A ticket for a new generation (a fresh id when none is given); already cancelled
        when a cancel for its id came first."""
        rid = request_id or f"gen-{uuid.uuid4().hex[:16]}"
        with self._lock:
            if rid in self._open:
                raise DuplicateRequestId(f"a generation with request_id {rid!r} is already "
                                         "admitted", param="request_id")
            self._expire_early()
            ticket = Ticket(rid)
            if self._early.pop(rid, None) is not None:
                ticket.cancel()
            self._open[rid] = ticket
            self._closed.pop(rid, None)
            return ticket

    def close(self, ticket: Ticket) -> None:
        """The generation is over (done, failed or cancelled): its cancels end here."""
        with self._lock:
            if self._open.get(ticket.request_id) is ticket:
                del self._open[ticket.request_id]
                self._closed[ticket.request_id] = None
                while len(self._closed) > self._remember_max:
                    self._closed.popitem(last=False)

    def cancel(self, request_id: str) -> CancelOutcome:
        """Cancel one generation by id, admitted or not yet."""
        with self._lock:
            ticket = self._open.get(request_id)
            if ticket is not None:
                ticket.cancel()
                return CancelOutcome.CANCELLING
            if request_id in self._closed:
                return CancelOutcome.FINISHED
            self._expire_early()
            self._early[request_id] = self._clock()
            self._early.move_to_end(request_id)
            while len(self._early) > self._remember_max:
                self._early.popitem(last=False)
            return CancelOutcome.REMEMBERED

    def cancel_open(self) -> list[str]:
        """Cancel every admitted generation (queued or running); remembers nothing."""
        with self._lock:
            for ticket in self._open.values():
                ticket.cancel()
            return list(self._open)

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def _expire_early(self) -> None:
        horizon = self._clock() - self._remember_s
        while self._early and next(iter(self._early.values())) < horizon:
            self._early.popitem(last=False)
