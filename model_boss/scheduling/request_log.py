"""RequestLog: one JSON line per finished request, the format the trace simulator replays."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import orjson

from ..slot_key import SlotKey
from .replicas import cached_prefix_tokens

if TYPE_CHECKING:
    from .request import SlotTicket

log = logging.getLogger(__name__)


class RowExtras(TypedDict, total=False):
    """What a request log row shows beyond the trace line (:class:`RequestRing`'s rows)."""

    load_wait_s: float
    task: str | None
    rung: int | None
    endpoint: str | None
    prompt: str | None
    end_user: str
    # where its model runs as replicas: the copy that served (its key, ``id#n`` past the
    # first, as the row shows it), why there, and the prompt tokens that copy had cached
    replica: SlotKey
    route: str | None
    cached_prefix_tokens: int
    trace_id: str  # its OpenTelemetry trace, where traces are on


class RequestLog:
    """Appends ``{"timestamp", "model", "priority", "duration", "size_mb", "client_id",
    "ok", "load_s"}`` to ``path`` (``state_dir/requests.jsonl``): ``timestamp`` is the
    arrival, ``load_s`` the model's learned cold load. Replay it with
    ``model-boss simulate --trace``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle = None

    def finished(self, ticket: SlotTicket, ok: bool, duration: float,
                 load_s: float | None) -> None:
        """Write the request ``ticket`` was granted for, finished after ``duration`` s."""
        request, slot = ticket.request, ticket.slot
        self.write(model=slot.model_id, priority=request.priority, ok=ok, duration=duration,
                   client_id=request.client_id, size_mb=slot.estimate.mb if slot.estimate else 0,
                   submitted_at=request.submitted_at, load_s=load_s, tokens=ticket.tokens,
                   extra={"load_wait_s": ticket.load_wait_s, "task": request.task,
                          "rung": request.rung, "endpoint": request.endpoint or None,
                          "prompt": request.prompt, "end_user": request.end_user,
                          "trace_id": request.trace_id, **_replica(ticket)})

    def write(self, *, model: str, priority: int, duration: float, size_mb: int,
              client_id: str, ok: bool, submitted_at: float | None = None,
              load_s: float | None = None, tokens: int | None = None,
              extra: RowExtras | None = None) -> None:
        """``tokens`` (generated, when the answer said) and ``extra`` (the load wait, task,
        rung, endpoint and a captured prompt) are for :class:`RequestRing`'s rows; the trace
        line keeps its format."""
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


def _replica(ticket: SlotTicket) -> RowExtras:
    """Where a model runs as replicas: the one that served and why (a request log row's)."""
    if ticket.slot.entry.manifest.replicas.max < 2:
        return {}
    route = ticket.route
    return {"replica": ticket.slot.key, "route": route.reason if route else None,
            "cached_prefix_tokens": cached_prefix_tokens(route)}


def prompt_text(body: dict, capture: bool, limit: int) -> str | None:
    """The text a request asked with, for the request log when ``capture`` is on (else None):
    the last message's text (a chat, a message), else its prompt, input or query, cut to
    ``limit`` characters."""
    if not capture:
        return None
    messages = body.get("messages")
    found = messages[-1].get("content") if isinstance(messages, list) and messages \
        and isinstance(messages[-1], dict) else None
    if found is None:
        found = next((body[k] for k in ("prompt", "input", "query") if body.get(k)), None)
    if isinstance(found, list):  # content parts, or a batch of inputs
        found = " ".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in found)
    return None if found is None else str(found)[:limit]
