"""LearnedStats: per-model figures learned from what actually happened, kept across restarts.

Cold-load and inference seconds are exponentially weighted moving averages; VRAM is the last
real measurement. A model that ran with only some of its layers on the GPU (a partial
offload: placement.partial_layers) has its inference and VRAM figures kept apart for each
such count, since a model at 20 of 28 layers is slower and smaller than at 28. Saved as JSON
in ``state_dir/learned.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ALPHA = 0.3            # weight of the newest observation
LOAD_BASE_S = 1.0      # before any observation: process start ...
LOAD_MB_PER_S = 2000.0  # ... plus reading the weights at this rate
SAVE_EVERY_S = 10.0


@dataclass(slots=True)
class RunStats:
    """How a model runs with a number of its layers on the GPU."""

    infer_s: float | None = None
    requests: int = 0
    vram_mb: int | None = None
    # seconds per unit of work a request asked for (a token it may generate, an image step):
    # learned from the requests that said their length
    s_per_unit: float | None = None

    def observe(self, seconds: float, work: float | None) -> None:
        self.infer_s = round(ewma(self.infer_s, seconds), 4)
        self.requests += 1
        if work:
            self.s_per_unit = round(ewma(self.s_per_unit, seconds / work), 6)

    def infer_time(self, work: float | None) -> float | None:
        """One request's time: ``work`` units at the learned rate where both are known, else
        the learned mean request; None before any."""
        if work and self.s_per_unit is not None:
            return work * self.s_per_unit
        return self.infer_s


@dataclass(slots=True)
class ModelStats(RunStats):
    """The model's figures: its loads, and how it runs whole (every layer on the GPU, or on
    the CPU with no GPU at all); ``layers``: how it runs with only N layers on the GPU, by
    N."""

    load_s: float | None = None
    loads: int = 0
    layers: dict[int, RunStats] = field(default_factory=dict)

    def at(self, layers: int | None) -> RunStats:
        """The figures of a run with ``layers`` on the GPU (None: whole)."""
        if layers is None:
            return self
        found = self.layers.get(layers)
        if found is None:
            found = self.layers[layers] = RunStats()
        return found

    @classmethod
    def from_dict(cls, data: dict) -> ModelStats:
        layers = {int(n): RunStats(**figures)
                  for n, figures in (data.pop("layers", None) or {}).items()}
        return cls(**data, layers=layers)


def ewma(old: float | None, new: float) -> float:
    return new if old is None else (ALPHA * new + (1 - ALPHA) * old)


def nearest(counts: list[int], layers: int | None) -> int | None:
    """Of the layer counts a model has figures for, the one closest to ``layers`` (None:
    whole, closest to the most), the fewer of two as close (the slower: a prediction that
    errs, errs long); None when there are none."""
    if not counts:
        return None
    if layers is None:
        return max(counts)
    return min(counts, key=lambda n: (abs(n - layers), n))


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

    def observe_inference(self, model_id: str, seconds: float, work: float | None = None,
                          layers: int | None = None) -> None:
        """A request served in ``seconds``; ``work``: the units it asked for, when it said;
        ``layers``: the model's layers on the GPU when only some were (None: whole)."""
        self.get(model_id).at(layers).observe(seconds, work)
        self._touch()

    def observe_vram(self, model_id: str, mb: int, layers: int | None = None) -> None:
        """The VRAM the model's worker really holds, with ``layers`` on the GPU (None:
        whole)."""
        self.get(model_id).at(layers).vram_mb = int(mb)
        self._touch()

    def measured_vram(self, model_id: str, layers: int | None = None) -> int | None:
        """The VRAM measured with ``layers`` on the GPU (None: whole); another count's
        figure is never this one's."""
        stats = self.models.get(model_id)
        if stats is None:
            return None
        return stats.vram_mb if layers is None else \
            (stats.layers[layers].vram_mb if layers in stats.layers else None)

    def predicted_load_s(self, model_id: str, size_mb: int) -> float:
        """Learned EWMA, else a figure derived from the model's size."""
        learned = self.get(model_id).load_s
        return learned if learned is not None else LOAD_BASE_S + size_mb / LOAD_MB_PER_S

    def predicted_infer_s(self, model_id: str, work: float | None = None,
                          layers: int | None = None) -> float:
        """One request's serving time with ``layers`` on the GPU (None: whole): ``work``
        units at the learned rate, where both are known, else the learned mean request; of
        the figures learned at that count, else at the nearest count learned
        (:func:`nearest`), else whole; 0 before any."""
        stats = self.get(model_id)
        learned = [n for n, run in stats.layers.items() if run.requests]
        closest = nearest(learned, layers)
        runs = [stats.layers[n] for n in (layers, closest) if n is not None and n in learned]
        runs.insert(0 if layers is None else len(runs), stats)
        for run in runs:
            seconds = run.infer_time(work)
            if seconds is not None:
                return seconds
        return 0.0

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
            self.models = {k: ModelStats.from_dict(dict(v))
                           for k, v in data.get("models", {}).items()}
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
