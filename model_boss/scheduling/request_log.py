"""RequestLog: one JSON line per finished request, the format the trace simulator replays."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson

log = logging.getLogger(__name__)


class RequestLog:
    """Appends ``{"timestamp", "model", "priority", "duration", "size_mb", "client_id",
    "ok", "load_s"}`` to ``path`` (``state_dir/requests.jsonl``): ``timestamp`` is the
    arrival, ``load_s`` the model's learned cold load. Replay it with
    ``model-boss simulate --trace``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle = None

    def write(self, *, model: str, priority: int, duration: float, size_mb: int,
              client_id: str, ok: bool, submitted_at: float | None = None,
              load_s: float | None = None, tokens: int | None = None) -> None:
        """``tokens`` (generated, when the answer said) is for :class:`RequestRing`'s rows;
        the trace line keeps its format."""
        if self.path is None:
            return
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = self.path.open("ab", buffering=0)
            self._handle.write(orjson.dumps({
                "timestamp": round(submitted_at or time.time(), 3), "model": model,
                "priority": priority, "duration": round(duration, 4), "size_mb": size_mb,
                "client_id": client_id, "ok": ok, "load_s": load_s}) + b"\n")
        except OSError as exc:
            log.warning("request log %s: %s; logging off", self.path, exc)
            self.path = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
