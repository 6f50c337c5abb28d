"""RequestRing: the request log, plus its last rows in memory for ``GET /api/v1/requests``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...scheduling.request_log import RequestLog, RowExtras

Row = dict[str, Any]


class RequestRing(RequestLog):
    """Writes the JSON lines :class:`RequestLog` writes and keeps the last ``keep`` finished
    requests as rows (no prompt text); ``listeners`` are called with each new row."""

    def __init__(self, path: Path | None, keep: int = 1000) -> None:
        super().__init__(path)
        self._rows: deque[Row] = deque(maxlen=keep)
        self.listeners: list[Callable[[Row], None]] = []

    def write(self, *, model: str, priority: int, duration: float, size_mb: int,
              client_id: str, ok: bool, submitted_at: float | None = None,
              load_s: float | None = None, tokens: int | None = None,
              extra: RowExtras | None = None) -> None:
        super().write(model=model, priority=priority, duration=duration, size_mb=size_mb,
                      client_id=client_id, ok=ok, submitted_at=submitted_at, load_s=load_s)
        extra = extra or {}
        now = time.time()
        # from arrival to the grant: the wait in the queue, a load it waited for included
        waited = None if submitted_at is None else max(0.0, now - duration - submitted_at)
        row: Row = {"t": round(now, 3), "model": model, "client_id": client_id,
                    "priority": priority,
                    "queue_wait_s": None if waited is None else round(waited, 4),
                    "load_wait_s": extra.get("load_wait_s"), "duration_s": round(duration, 4),
                    "tokens": tokens, "status": "ok" if ok else "failed",
                    "task": extra.get("task"), "rung": extra.get("rung"),
                    "endpoint": extra.get("endpoint")}
        if extra.get("end_user"):  # the client id a key's request named under the key
            row["end_user"] = extra["end_user"]
        if extra.get("replica") is not None:  # its model runs as replicas: which, and why
            row.update(replica=extra["replica"], route=extra.get("route"),
                       cached_prefix_tokens=extra.get("cached_prefix_tokens"))
        if extra.get("trace_id"):  # traces are on: the dashboard links it
            row["trace_id"] = extra["trace_id"]
        if extra.get("prompt") is not None:  # captured: the setting is on
            row["prompt"] = extra["prompt"]
        self._rows.append(row)
        for listener in self.listeners:
            listener(row)

    def recent(self, limit: int = 100, model: str | None = None,
               client: str | None = None) -> list[Row]:
        """The last ``limit`` rows, newest first, of ``model`` and ``client`` (a client id, a
        key or an end user under a key) when given."""
        found: list[Row] = []
        for row in reversed(self._rows):
            if len(found) >= limit:
                break
            if (model is None or row["model"] == model) and (
                    client is None or client in (row["client_id"], row.get("end_user"))):
                found.append(dict(row))
        return found

    def __len__(self) -> int:
        return len(self._rows)
