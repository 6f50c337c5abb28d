"""QueuedRequest: one request waiting for its model; SlotTicket: the right to send it to a
READY slot once granted, released exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .ordering import Waiter
from .seams import SlotReading


@dataclass(eq=False)
class QueuedRequest:
    """One request waiting for its model. ``deadline`` comes from the budget or the wait cap."""

    model_id: str
    priority: int
    client_id: str = "anonymous"
    endpoint: str = ""
    budget_s: float | None = None
    keep_alive_s: float | None = None
    max_concurrency: int | None = None
    max_queued: int | None = None  # the client's own limit on waiting requests
    share: float = 1.0  # fair-share weight among clients of equal priority
    rank: float = 0.0  # fair-share rank, fixed when it joins the queue
    submitted_at: float = field(default_factory=time.time)
    deadline: float = 0.0
    request_id: str = field(default_factory=lambda: "req-" + uuid.uuid4().hex[:16])
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop()
                                   .create_future())

    @property
    def waiter(self) -> Waiter:
        return Waiter(self.model_id, self.priority, self.client_id, self.submitted_at,
                      self.rank)


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
        self.waited_s = round(time.time() - request.submitted_at, 4)
        self._released = False

    def release(self, ok: bool = True, client_fault: bool = False) -> None:
        if self._released:
            return
        self._released = True
        self._on_release(self, ok, client_fault)
