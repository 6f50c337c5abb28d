"""The pipeline holder: the one owner of the pipeline's state, its admitted generations and
the moves of its weights between VRAM and CPU RAM.

States are ``PipelineState`` with one transition table, checked by ``_transition`` (the only
place the state changes; it logs and keeps a short history). Decisions that refuse a request
(generate while parked, offload while generating) are taken under one short lock together with
the state change they depend on, so no await or thread switch sits between check and act.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from ..tickets import Ticket
from .errors import (
    Busy,
    CudaOutOfMemory,
    IllegalTransition,
    MoveFailed,
    NotReady,
    OffloadUnsupported,
    PipelineOffloaded,
    WorkerError,
)
from .loader import LoadedPipeline, LoadProgress
from .memory import Offload, cuda_report, release_cuda_cache, rss_mb
from .options import WorkerOptions
from .tickets import TicketBook

log = logging.getLogger(__name__)


class PipelineState(StrEnum):
    """Lifecycle of the pipeline inside this worker."""

    SPARE = "spare"  # a pre-started worker, imports done, no model yet (POST /load names one)
    LOADING = "loading"  # from_pretrained in progress
    READY = "ready"  # weights on the device: the only state generations are admitted in
    OFFLOADING = "offloading"  # weights moving to CPU RAM
    OFFLOADED = "offloaded"  # weights parked in CPU RAM
    ONLOADING = "onloading"  # weights moving back to the device
    FAILED = "failed"  # the load (or a move that could not be undone) failed: final


P = PipelineState
# The one transition table. A failed move is undone where possible (OFFLOADING -> READY,
# ONLOADING -> OFFLOADED); where it cannot be, the pipeline is FAILED.
TRANSITIONS: dict[PipelineState, frozenset[PipelineState]] = {
    P.SPARE: frozenset({P.LOADING}),
    P.LOADING: frozenset({P.READY, P.FAILED}),
    P.READY: frozenset({P.OFFLOADING}),
    P.OFFLOADING: frozenset({P.OFFLOADED, P.READY, P.FAILED}),
    P.OFFLOADED: frozenset({P.ONLOADING}),
    P.ONLOADING: frozenset({P.READY, P.OFFLOADED, P.FAILED}),
    P.FAILED: frozenset(),
}
# The process is healthy and its pipeline loaded: GET /health answers 200.
LOADED = frozenset({P.READY, P.OFFLOADING, P.OFFLOADED, P.ONLOADING})
# Where the weights are in each state, as /health reports it ("gpu" = the compute device).
TIER: dict[PipelineState, str] = {P.SPARE: "cpu", P.LOADING: "cpu", P.READY: "gpu",
                                  P.OFFLOADING: "gpu", P.OFFLOADED: "cpu", P.ONLOADING: "cpu",
                                  P.FAILED: "cpu"}


def check_transition(old: PipelineState, new: PipelineState) -> None:
    """Raise ``IllegalTransition`` unless the table allows ``old -> new``."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"pipeline state {old} -> {new} is not allowed")


class PipelineHolder:
    """Owns the loaded pipeline, its ``PipelineState`` and the admitted generations.

    ``weights_lock`` is held by whatever touches the weights (a generation, an offload, an
    onload), so even a generation whose HTTP request went away cannot overlap a move.
    """

    def __init__(self, options: WorkerOptions, tickets: TicketBook | None = None) -> None:
        self.options = options
        self.tickets = tickets if tickets is not None else TicketBook()
        self.weights_lock = threading.Lock()
        self.loaded: LoadedPipeline | None = None
        self.load_progress = LoadProgress()
        self.error: str | None = None
        self.history: deque[tuple[float, str, str]] = deque(maxlen=20)
        self._state = P.SPARE if options.spare else P.LOADING
        self._lock = threading.Lock()  # state + admission; never held across real work

    @property
    def state(self) -> PipelineState:
        return self._state

    @property
    def device(self) -> str:
        return self.loaded.device if self.loaded else "cpu"

    @property
    def can_offload(self) -> bool:
        """A device-mapped pipeline cannot be moved with ``to()``; everything else can."""
        return not (self.device == "cuda" and self.options.offload is Offload.BALANCED)

    def _transition(self, new: PipelineState, reason: str) -> None:
        """The only state change: checked against the table, logged, kept in ``history``.
        Called with ``_lock`` held."""
        old = self._state
        check_transition(old, new)
        self._state = new
        self.history.append((time.time(), f"{old}->{new}", reason))
        log.info("pipeline %s -> %s: %s", old, new, reason)

    # -- loading ----------------------------------------------------------------------------

    def assign(self, options: WorkerOptions) -> None:
        """A spare takes its model: SPARE -> LOADING with ``options`` (once; a worker that
        has a model, or is loading one, refuses with ``Busy``)."""
        with self._lock:
            if self._state is not P.SPARE:
                raise Busy(f"this worker is not a spare (the pipeline is {self._state})")
            self.options = options
            self._transition(P.LOADING, f"spare assigned {options.model}")

    def start_loading(self, load: Callable[[], LoadedPipeline]) -> threading.Thread:
        """Run ``load`` in a daemon thread (so /health answers at once, and a SIGTERM never
        waits for a load): LOADING -> READY, or FAILED with the error."""

        def run() -> None:
            try:
                loaded = load()
            except Exception as exc:
                log.exception("loading %s failed", self.options.model)
                with self._lock:
                    self.error = f"{type(exc).__name__}: {exc}"
                    self._transition(P.FAILED, "load failed")
                return
            with self._lock:
                self.loaded = loaded
                self._transition(P.READY, f"loaded in {loaded.load_s}s")

        thread = threading.Thread(target=run, name="load", daemon=True)
        thread.start()
        return thread

    # -- admission --------------------------------------------------------------------------

    def admit(self, request_id: str | None = None) -> Ticket:
        """A ticket for a new generation, or the error that refuses it. While a ticket is
        open the weights do not move."""
        with self._lock:
            if self._state in (P.SPARE, P.LOADING, P.FAILED):
                detail = f": {self.error}" if self.error else ""
                raise NotReady(f"the pipeline is {self._state}{detail}")
            if self._state is not P.READY:
                raise PipelineOffloaded(f"the pipeline is {self._state} (weights in CPU RAM); "
                                        "POST /onload before generating")
            return self.tickets.open(request_id)

    def release(self, ticket: Ticket) -> None:
        """The generation is over; once no ticket is open the weights may move again."""
        self.tickets.close(ticket)

    # -- the CPU-RAM tier -------------------------------------------------------------------

    async def offload(self) -> dict[str, Any]:
        """READY -> OFFLOADING -> OFFLOADED: weights to CPU RAM (under model / sequential /
        group offload they rest there already). Idempotent when already OFFLOADED."""
        with self._lock:
            self._check_movable("offload")
            if self._state is P.OFFLOADED:
                return {"tier": TIER[P.OFFLOADED], "freed_mb": 0, "seconds": 0.0}
            self._transition(P.OFFLOADING, "offload asked")
        return await asyncio.to_thread(self._park)

    async def onload(self) -> dict[str, Any]:
        """OFFLOADED -> ONLOADING -> READY: weights back to the device. Idempotent when READY."""
        with self._lock:
            self._check_movable("onload")
            if self._state is P.READY:
                return {"tier": TIER[P.READY], "device": self.device, "seconds": 0.0}
            self._transition(P.ONLOADING, "onload asked")
        return await asyncio.to_thread(self._unpark)

    def _check_movable(self, verb: str) -> None:
        if self._state in (P.SPARE, P.LOADING, P.FAILED):
            raise NotReady(f"cannot {verb}: the pipeline is {self._state}")
        if len(self.tickets):
            raise Busy(f"cannot {verb} while generating")
        if not self.can_offload:
            raise OffloadUnsupported(f"cannot {verb} a device-mapped ('balanced') pipeline; "
                                     "stop the worker instead")
        if self._state in (P.OFFLOADING, P.ONLOADING):
            raise Busy(f"cannot {verb}: the pipeline is {self._state}")

    def _park(self) -> dict[str, Any]:
        assert self.loaded is not None
        with self.weights_lock:
            started = time.monotonic()
            before = self.memory().get("cuda_allocated_mb")
            try:
                self._move_weights("cpu")
            except Exception as exc:
                self._undo_move(self.device, P.READY, "offload failed")
                raise _move_error("offload", exc) from exc
            after = self.memory().get("cuda_allocated_mb")
            with self._lock:
                self._transition(P.OFFLOADED, "weights in CPU RAM")
        # CPU-only: what the coordinator's (declared) VRAM accounting gets back
        freed = before - after if before is not None and after is not None \
            else self.loaded.footprint_mb
        return {"tier": TIER[P.OFFLOADED], "freed_mb": freed,
                "seconds": round(time.monotonic() - started, 4)}

    def _unpark(self) -> dict[str, Any]:
        with self.weights_lock:
            started = time.monotonic()
            try:
                self._move_weights(self.device)
            except Exception as exc:
                self._undo_move("cpu", P.OFFLOADED, "onload failed")
                raise _move_error("onload", exc) from exc
            with self._lock:
                self._transition(P.READY, "weights on the device")
        return {"tier": TIER[P.READY], "device": self.device,
                "seconds": round(time.monotonic() - started, 4)}

    def _move_weights(self, device: str) -> None:
        """``pipe.to(device)`` unless offload hooks own the placement; after a move off CUDA,
        hand the freed VRAM back to the driver before answering (the coordinator releases
        the lease on that answer)."""
        assert self.loaded is not None
        if self.loaded.hooks is None:
            # parked, not run there: no "float16 cannot run on the CPU" warning
            self.loaded.pipe.to(device, silence_dtype_warnings=True)
        if self.loaded.device == "cuda" and device == "cpu":
            release_cuda_cache()

    def _undo_move(self, back_to: str, state: PipelineState, reason: str) -> None:
        """Put the weights back where they were; FAILED when even that does not work."""
        try:
            self._move_weights(back_to)
        except Exception as exc:
            log.exception("could not undo a failed move")
            with self._lock:
                self.error = f"{reason}, and undoing it failed: {type(exc).__name__}: {exc}"
                self._transition(P.FAILED, reason)
            return
        with self._lock:
            self._transition(state, reason)

    # -- reports ----------------------------------------------------------------------------

    def memory(self) -> dict[str, Any]:
        """RSS always; allocated / reserved / peak / free VRAM when on CUDA."""
        report: dict[str, Any] = {"rss_mb": rss_mb()}
        if self.device == "cuda":
            report.update(cuda_report())
        return report

    def report(self) -> dict[str, Any]:
        """The holder's part of ``GET /health``."""
        loaded, state = self.loaded, self._state
        return {"state": str(state), "error": self.error, "model": self.options.model,
                "tier": TIER[state], "device": self.device,
                "dtype": loaded.dtype if loaded else "float32",
                "offload": str(self.options.offload), "can_offload": self.can_offload,
                "loads_from_disk": 1 if loaded else 0,
                "load_s": loaded.load_s if loaded else None,
                "ready_s": loaded.ready_s if loaded else None,
                "footprint_mb": loaded.footprint_mb if loaded else None,
                # reference images are taken only with an IP-Adapter: its weights file
                "ip_adapter": loaded.ip_adapter if loaded else None,
                # the LoRA adapters a request may name ("adapter"), all off otherwise
                "loras": list(loaded.loras) if loaded else [],
                "memory": self.memory(), "generating": len(self.tickets) > 0,
                "request_ids": self.tickets.open_ids(),
                "notes": list(loaded.notes) if loaded else [], "pid": os.getpid(),
                "load": self.load_progress.to_dict() if state is P.LOADING else None,
                "transitions": [t for _, t, _ in self.history]}


def _move_error(verb: str, exc: Exception) -> WorkerError:
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
        return CudaOutOfMemory(f"CUDA out of memory during {verb}: {exc}"[:500])
    return MoveFailed(f"{verb} failed: {type(exc).__name__}: {exc}"[:500])
