"""LoadStages: each model's recent loads as their stages (leasing, starting, loading,
warming), heard from the ``load_progress`` events, so a request's trace can show the stages of
the load it waited for (:mod:`model_boss.services.request_trace`). Kept only while traces are
on: nothing listens otherwise."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

KEEP = 8  # finished loads kept per model: enough for the replicas of one model loading at once
_ENDS = frozenset({"ready", "failed"})
# how far a load's "ready" event may be from the moment its slot says it became READY
MATCH_S = 5.0


@dataclass(slots=True)
class Load:
    """One load: its stages in order as (stage, began at), how it ended and when, and its
    tier: "cpu" (its weights came back from CPU RAM) or "disk" (a cold start)."""

    model: str
    stages: list[tuple[str, float]] = field(default_factory=list)
    tier: str = "disk"
    outcome: str | None = None
    ended_at: float = 0.0

    def spans(self, since: float = 0.0) -> list[tuple[str, float, float]]:
        """Each stage as (stage, began, ended), cut to what happened after ``since`` (a
        request that came while the load ran waited for its later stages only)."""
        times = [*self.stages, ("", self.ended_at)]
        found = []
        for (stage, began), (_, ended) in zip(times, times[1:], strict=False):
            if ended > since:
                found.append((stage, max(began, since), ended))
        return found


class LoadStages:
    """Listens to the event bus (:meth:`heard`) and answers :meth:`of`."""

    def __init__(self) -> None:
        self._running: dict[str, Load] = {}
        self._done: dict[str, deque[Load]] = {}

    def heard(self, event: dict[str, Any]) -> None:
        if event.get("type") != "load_progress":
            return
        model, stage, at = event.get("model"), event.get("stage"), event.get("ts", 0.0)
        if not isinstance(model, str) or not isinstance(stage, str):
            return
        load = self._running.get(model)
        if load is None or stage == "leasing" and load.stages:
            load = self._running[model] = Load(model)
        if stage in _ENDS:
            self._running.pop(model, None)
            load.outcome, load.ended_at = stage, at
            self._done.setdefault(model, deque(maxlen=KEEP)).append(load)
            return
        if event.get("tier") == "cpu":
            load.tier = "cpu"
        if not load.stages or load.stages[-1][0] != stage:
            load.stages.append((stage, at))

    def of(self, model: str, ready_at: float | None) -> Load | None:
        """The finished load of ``model`` that made it ready at ``ready_at`` (the slot's
        ``loaded_at``), the nearest within :data:`MATCH_S`; None when none is known."""
        if not ready_at:
            return None
        loads = [load for load in self._done.get(model, ()) if load.outcome == "ready"
                 and abs(load.ended_at - ready_at) <= MATCH_S]
        return min(loads, key=lambda load: abs(load.ended_at - ready_at), default=None)
