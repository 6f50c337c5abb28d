"""LoadProgress: where one load is, told as ``load_progress`` events.

Stages in order: leasing (room and a VRAM lease), starting (the worker process comes up),
loading (weights; with a fraction where the worker reports one), warming (the worker's own
warm-up run), ready; or failed. A stage is emitted once; within a stage a changed fraction is
emitted at most every :data:`FRACTION_STEP`. A report that would go backwards is dropped:
llama.cpp's ``/health`` keeps saying "Loading model" while the model warms up.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from ..events import EventBus


class LoadStage(StrEnum):
    LEASING = "leasing"
    STARTING = "starting"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"


ORDER = {stage: rank for rank, stage in enumerate(LoadStage)}
FINAL = frozenset({LoadStage.READY, LoadStage.FAILED})
FRACTION_STEP = 0.05  # smaller moves within a stage are not worth an event


def advances(current: LoadStage | None, fraction: float | None, new: LoadStage,
             new_fraction: float | None) -> bool:
    """Whether a report of ``new``/``new_fraction`` is news after ``current``/``fraction``:
    a later stage, or in the same (unfinished) stage a fraction at least one step further
    (or the first fraction, or the last: 1.0)."""
    if current is None:
        return True
    if current in FINAL:
        return False
    if ORDER[new] != ORDER[current]:
        return ORDER[new] > ORDER[current]
    if new_fraction is None:
        return False
    if fraction is None or new_fraction >= 1.0 > fraction:
        return True
    return new_fraction - fraction >= FRACTION_STEP


class LoadProgress:
    """One load's progress; the load reports, this decides what is news and emits it."""

    def __init__(self, events: EventBus, model_id: str) -> None:
        self.events = events
        self.model_id = model_id
        self.started = time.monotonic()
        self.stage: LoadStage | None = None
        self.fraction: float | None = None
        self.updated_at = time.time()

    def report(self, stage: str, fraction: float | None = None, **fields: Any) -> None:
        """A stage (and fraction, 0..1) reached; emitted when it is news."""
        new = LoadStage(stage)
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        if not advances(self.stage, self.fraction, new, fraction):
            return
        self.stage, self.fraction, self.updated_at = new, fraction, time.time()
        self.events.emit("load_progress", model=self.model_id, stage=str(new),
                         fraction=None if fraction is None else round(fraction, 3),
                         elapsed_s=self.elapsed_s(), **fields)

    def elapsed_s(self) -> float:
        return round(time.monotonic() - self.started, 3)

    @property
    def finished(self) -> bool:
        return self.stage in FINAL

    def snapshot(self) -> dict[str, Any]:
        """The stage now, for status documents and waiting clients."""
        return {"stage": str(self.stage) if self.stage else None, "fraction": self.fraction,
                "elapsed_s": self.elapsed_s()}
