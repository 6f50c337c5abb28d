"""EventBus: loads, evictions, crashes, offloads, fallbacks — logged, kept, and streamed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

log = logging.getLogger("model_boss.events")


class EventBus:
    """Keeps the last ``keep`` events and fans new ones out to subscribers (SSE)."""

    def __init__(self, keep: int = 500) -> None:
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._subscribers: set[asyncio.Queue] = set()
        self._listeners: list = []
        self._seq = 0

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        event = {"seq": self._seq, "ts": time.time(), "type": kind, **fields}
        self._recent.append(event)
        log.info("%s %s", kind, " ".join(f"{k}={v}" for k, v in fields.items()))
        for listener in self._listeners:
            listener(event)
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # a slow subscriber loses events, never blocks us
                pass
        return event

    def recent(self, kind: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        return [
            e for e in self._recent
            if (kind is None or e["type"] == kind) and (model is None or e.get("model") == model)
        ]

    def listen(self, callback) -> None:
        """Call ``callback(event)`` synchronously for every event (metrics use this)."""
        self._listeners.append(callback)

    def subscribe(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(maxsize=1000)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._subscribers.discard(queue)
