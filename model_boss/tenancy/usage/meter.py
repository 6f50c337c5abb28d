"""Meter: each granted request's share of its slot's time and VRAM, and the load it caused,
turned into a usage row when it finishes (the usage ledger's GPU-seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ...slot_key import SlotKey
from .clock import BusyShare
from .figures import Figures
from .row import UsageRow


class MeteredSlot(Protocol):
    loaded_at: float | None
    ready_in_s: float

    @property
    def model_id(self) -> str: ...

    @property
    def key(self) -> SlotKey: ...

    @property
    def leased_mb(self) -> int: ...


class MeteredRequest(Protocol):
    key: str
    end_user: str
    endpoint: str
    request_id: str


class MeteredTicket(Protocol):
    """A granted request as the meter reads it (the queue's ticket)."""

    slot: MeteredSlot
    request: MeteredRequest
    figures: Figures
    status: int
    metered: int | None
    load_s: float
    waited_s: float


class Meter:
    """A busy clock per slot, that is per copy of a model (:class:`~model_boss.tenancy.usage.
    BusyShare`): requests served at once on one copy split its time between them, so the
    GPU-seconds of all requests add up to the time each copy was busy, however many copies
    ran at once. A load (or an onload from RAM) is charged once, to the first request granted
    on that copy after it: the one that was waiting for it."""

    def __init__(self, member: str = "") -> None:
        self.member = member
        self.on_row: Callable[[UsageRow], None] = lambda row: None  # the ledger's record
        self._clocks: dict[SlotKey, BusyShare] = {}
        self._charged: dict[SlotKey, float] = {}  # copy -> the loaded_at already charged
        self._running: dict[SlotKey, dict[int, MeteredTicket]] = {}  # copy -> tickets, by token

    def busy_s(self, key: SlotKey | str) -> float:
        """How long the copy ``key`` has had at least one request, since the start."""
        clock = self._clocks.get(SlotKey(key))
        return clock.busy_s if clock is not None else 0.0

    def running(self, key: SlotKey | str) -> list[MeteredTicket]:
        """The requests running on the copy ``key`` now (granted, not finished)."""
        return list(self._running.get(SlotKey(key), {}).values())

    def granted(self, ticket: MeteredTicket, now: float | None = None) -> None:
        slot = ticket.slot
        clock = self._clocks.setdefault(slot.key, BusyShare())
        ticket.metered = clock.enter(time.monotonic() if now is None else now)
        self._running.setdefault(slot.key, {})[ticket.metered] = ticket
        loaded_at = slot.loaded_at
        if loaded_at is not None and self._charged.get(slot.key) != loaded_at:
            self._charged[slot.key] = loaded_at
            ticket.load_s = slot.ready_in_s

    def finished(self, ticket: MeteredTicket, ok: bool, client_fault: bool, duration_s: float,
                 now: float | None = None) -> UsageRow:
        """The row for ``ticket``'s request, now that it has given its slot back (also
        handed to ``on_row``)."""
        slot, request, figures = ticket.slot, ticket.request, ticket.figures
        share = 0.0
        if ticket.metered is not None:
            self._running.get(slot.key, {}).pop(ticket.metered, None)
            share = self._clocks[slot.key].leave(
                ticket.metered, time.monotonic() if now is None else now)
            ticket.metered = None
        gpu_s = share + ticket.load_s
        status = ticket.status if ok else (499 if client_fault and ticket.status < 400
                                           else max(ticket.status, 500))
        row = UsageRow(
            key=request.key, end_user=request.end_user, model=slot.model_id,
            endpoint=request.endpoint, outcome=outcome(ok, client_fault, status),
            http_status=status, request_id=request.request_id, member=self.member,
            queue_wait_s=ticket.waited_s, duration_s=round(duration_s, 6),
            prompt_tokens=figures.prompt_tokens, completion_tokens=figures.completion_tokens,
            cached_tokens=figures.cached_tokens, images=figures.images, steps=figures.steps,
            audio_seconds=figures.audio_seconds, gpu_seconds=gpu_s,
            vram_mb_seconds=gpu_s * slot.leased_mb, load_seconds=ticket.load_s)
        self.on_row(row)
        return row


def outcome(ok: bool, client_fault: bool, status: int) -> str:
    """How a request ended, as the ledger names it."""
    if ok and status < 400:
        return "ok"
    if client_fault and status == 499:
        return "cancelled"
    return "refused" if 400 <= status < 500 else "failed"
