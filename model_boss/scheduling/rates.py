"""RequestRates: each model's recent request rate, an exponentially decayed count.

Eviction weighs a model's reload cost by how often it is asked for; a decayed count remembers
both how often (frequency) and how lately (recency) in one number. Pure: callers pass the time.
"""

from __future__ import annotations

import math

DEFAULT_HORIZON_S = 120.0


class RequestRates:
    """``rate(model, now)``: requests per second over roughly the last ``horizon_s``."""

    def __init__(self, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._counts: dict[str, tuple[float, float]] = {}  # model -> (count, at)

    def record(self, model_id: str, now: float) -> None:
        self._counts[model_id] = (self._decayed(model_id, now) + 1.0, now)

    def rate(self, model_id: str, now: float) -> float:
        return self._decayed(model_id, now) / self.horizon_s

    def _decayed(self, model_id: str, now: float) -> float:
        count, at = self._counts.get(model_id, (0.0, now))
        return count * math.exp(-max(0.0, now - at) / self.horizon_s)
