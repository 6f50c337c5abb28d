"""The diffusers worker's ticket book: the shared one (``workers.tickets``: admission and
cancel by request id) with this worker's refusals, ``Cancelled`` and ``DuplicateRequestId``
(409s in its error envelope), and fresh ids named ``gen-...``."""

from __future__ import annotations

from .. import tickets
from .errors import Cancelled, DuplicateRequestId


class TicketBook(tickets.TicketBook):
    """The admitted generations by request id; a generation has the book's cancels."""

    id_prefix = "gen"

    def cancelled_error(self, request_id: str) -> Exception:
        return Cancelled(f"generation {request_id} cancelled")

    def duplicate_error(self, request_id: str) -> Exception:
        return DuplicateRequestId(f"a generation with request_id {request_id!r} is already "
                                  "admitted", param="request_id")
