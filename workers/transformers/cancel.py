"""Requests by id, and their cancellation (``POST /cancel``): the shared ticket book
(``workers.tickets``) with this worker's refusals and ``/cancel`` answer.

Every model request gets a ``Ticket`` when it arrives (its ``request_id``, or a fresh one); a
cancel marks it, whether it waits for the model, waits in the batcher, or runs: a
transcription stops at its next chunk (the model's next forward), speech at its next sentence,
and an embedding or rerank request still queued in the batcher leaves the queue (a batch
already running is short and runs out; that request's share is dropped). A cancel that
overtakes its own request is remembered a short while, so that request is refused when it
arrives. A cancel for an id already finished does nothing.
"""

from __future__ import annotations

from .. import tickets
from ..tickets import CancelOutcome
from .errors import WorkerError


class Cancelled(WorkerError):
    def __init__(self, request_id: str) -> None:
        super().__init__(409, f"request {request_id} was cancelled", "cancelled")


class Tickets(tickets.TicketBook):
    """The open requests by id, and what was cancelled (``/health`` shows it)."""

    id_prefix = "req"

    def cancelled_error(self, request_id: str) -> Exception:
        return Cancelled(request_id)

    def duplicate_error(self, request_id: str) -> Exception:
        return WorkerError(409, f"a request with request_id {request_id!r} is already "
                           "running", "duplicate_request_id", "request_id")

    def cancel(self, request_id: str | None) -> dict[str, object]:  # type: ignore[override]
        """The ``POST /cancel`` answer: one request by id (admitted or not yet), or every
        open one (no id; its outcome is "cancelling" even when none is open)."""
        if request_id is None:
            ids, outcome = self.cancel_open(), CancelOutcome.CANCELLING
        else:
            outcome = super().cancel(request_id)
            ids = [request_id] if outcome is CancelOutcome.CANCELLING else []
        return {"request_id": request_id, "outcome": outcome.value, "cancelled": ids}

    def running(self) -> list[str]:
        return self.open_ids()
