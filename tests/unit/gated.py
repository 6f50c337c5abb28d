"""A backend whose every step waits until the test lets it pass: deterministic interleavings."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

from model_boss.backends.base import UpstreamResponse
from model_boss.coordinator import Coordinator

from .fakes import coordinator


class Gates:
    """Named gates. ``hold(name)`` makes the next steps called ``name`` block until
    ``open(name)``; ``reached(name)`` waits until such a step has begun."""

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Event] = {}
        self._entered: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def hold(self, name: str) -> None:
        self._held[name] = asyncio.Event()
        self._entered[name] = asyncio.Event()

    def open(self, name: str) -> None:
        self._held.pop(name).set()

    async def passing(self, name: str) -> None:
        self._entered[name].set()
        gate = self._held.get(name)
        if gate is not None:
            await gate.wait()

    async def reached(self, name: str, timeout_s: float = 2.0) -> None:
        await asyncio.wait_for(self._entered[name].wait(), timeout_s)


class GatedBackend:
    """Every operation passes its gate first; ``die()`` kills it without telling anyone (as
    a SIGKILL looks before the exit watcher runs)."""

    needs_vram = True

    def __init__(self, entry, gates: Gates, log: list, can_offload: bool) -> None:
        self.entry = entry
        self.gates = gates
        self.log = log
        self.can_offload = can_offload
        self.on_exit = None
        self.port = None
        self.pid = 4000 + len(log)
        self.alive = False

    def _note(self, step: str) -> None:
        self.log.append((step, self.entry.manifest.id, id(self)))

    async def start(self, port, placement) -> None:
        self._note("start")
        await self.gates.passing("start")
        self.alive = True

    async def retire(self) -> None:  # a planned stop's save (a llama model's prompt caches)
        self._note("retire")
        await self.gates.passing("retire")

    async def stop(self) -> None:
        self._note("stop")
        await self.gates.passing("stop")
        self.alive = False

    async def offload(self) -> dict[str, Any]:
        self._note("offload")
        await self.gates.passing("offload")
        return {"freed_mb": 1}

    async def onload(self) -> dict[str, Any]:
        self._note("onload")
        await self.gates.passing("onload")
        return {"seconds": 0.0}

    async def health_check(self) -> bool:
        return self.alive

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        await self.gates.passing("request")
        return UpstreamResponse(200, {"content-type": "application/json"}, body=b"{}")

    async def report(self) -> dict[str, Any]:
        return {}

    async def kv_cache_usage(self) -> float | None:
        return None

    def die(self) -> None:
        self.alive = False


def gated_coordinator(tmp_path: Path, manifests: list[dict], offloadable: set[str] = frozenset(),
                      **settings: Any) -> tuple[Coordinator, Gates, list]:
    coord, log = coordinator(tmp_path, manifests, **settings)
    gates = Gates()
    coord.pool.backend_factory = lambda entry, s: GatedBackend(
        entry, gates, log, can_offload=entry.manifest.id in offloadable)
    return coord, gates, log


def steps(log: list, step: str, model: str) -> int:
    return sum(1 for entry in log if entry[0] == step and entry[1] == model)
