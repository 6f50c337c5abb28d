"""LearnedStats: per-model figures learned from what actually happened, kept across restarts.

Cold-load and inference seconds are exponentially weighted moving averages; VRAM is the last
real measurement. Saved as JSON in ``state_dir/learned.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ALPHA = 0.3            # weight of the newest observation
LOAD_BASE_S = 1.0      # before any observation: process start ...
LOAD_MB_PER_S = 2000.0  # ... plus reading the weights at this rate
SAVE_EVERY_S = 10.0


@dataclass(slots=True)
class ModelStats:
    load_s: float | None = None
    loads: int = 0
    infer_s: float | None = None
    requests: int = 0
    vram_mb: int | None = None
    # seconds per unit of work a request asked for (a token it may generate, an image step):
    # learned from the requests that said their length
    s_per_unit: float | None = None


def ewma(old: float | None, new: float) -> float:
    return new if old is None else (ALPHA * new + (1 - ALPHA) * old)


class LearnedStats:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.models: dict[str, ModelStats] = {}
        self._dirty_since: float | None = None
        self._saved_at = 0.0

    def get(self, model_id: str) -> ModelStats:
        stats = self.models.get(model_id)
        if stats is None:
            stats = self.models[model_id] = ModelStats()
        return stats

    def observe_load(self, model_id: str, seconds: float) -> None:
        stats = self.get(model_id)
        stats.load_s = round(ewma(stats.load_s, seconds), 4)
        stats.loads += 1
        self._touch()

    def observe_inference(self, model_id: str, seconds: float,
                          work: float | None = None) -> None:
        """A request served in ``seconds``; ``work``: the units it asked for, when it said."""
        stats = self.get(model_id)
        stats.infer_s = round(ewma(stats.infer_s, seconds), 4)
        stats.requests += 1
        if work:
            stats.s_per_unit = round(ewma(stats.s_per_unit, seconds / work), 6)
        self._touch()

    def observe_vram(self, model_id: str, mb: int) -> None:
        self.get(model_id).vram_mb = int(mb)
        self._touch()

    def predicted_load_s(self, model_id: str, size_mb: int) -> float:
        """Learned EWMA, else a figure derived from the model's size."""
        learned = self.get(model_id).load_s
        return learned if learned is not None else LOAD_BASE_S + size_mb / LOAD_MB_PER_S

    def predicted_infer_s(self, model_id: str, work: float | None = None) -> float:
        """One request's serving time: ``work`` units at the model's learned rate, where both
        are known; else its learned mean request (0 before any)."""
        stats = self.get(model_id)
        if work and stats.s_per_unit is not None:
            return work * stats.s_per_unit
        return stats.infer_s or 0.0

    def _touch(self) -> None:
        """Mark changed; write at most every SAVE_EVERY_S (and on shutdown) to keep disk
        I/O off the request path."""
        now = time.monotonic()
        self._dirty_since = self._dirty_since or now
        if now - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def flush(self) -> None:
        if self._dirty_since is not None:
            self.save()

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            self.models = {k: ModelStats(**v) for k, v in data.get("models", {}).items()}
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable learned stats %s: %s", self.path, exc)

    def save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"models": {k: asdict(v)
                                                  for k, v in self.models.items()}}))
            tmp.replace(self.path)
            self._dirty_since = None
            self._saved_at = time.monotonic()
        except OSError as exc:
            log.warning("could not save learned stats: %s", exc)

    def to_dict(self) -> dict:
        return {k: asdict(v) for k, v in self.models.items()}
