"""In-process backends for scheduling tests: the seam the pool's backend factory offers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from model_boss.backends.base import UpstreamResponse
from model_boss.catalog import Catalog, ModelManifest
from model_boss.coordinator import Coordinator
from model_boss.services import run_job
from model_boss.settings import Settings


class FakeBackend:
    """Answers at once (or after ``delay``); records every call."""

    needs_vram = True
    can_offload = False

    def __init__(self, entry, settings, log: list, load_s: float = 0.0,
                 fail: Exception | None = None, gate: asyncio.Event | None = None,
                 streams: bool = False, tokens: int | None = None,
                 fail_starts: list[BaseException] | None = None) -> None:
        self.entry = entry
        self.streams = streams  # answer ``stream: true`` with a stream (else a whole body)
        self.tokens = tokens  # a whole answer says it generated this many (usage)
        self.log = log
        self.load_s = load_s
        self.fail_starts = fail_starts  # shared by every start: each takes the next failure
        self.fail = fail
        self.gate = gate
        self.on_exit = None
        self.port = None
        self.pid = 4242
        self.stopped = False
        self.alive = True
        self.kv_cache: float | None = None

    async def start(self, port, placement) -> None:
        self.log.append(("start", self.entry.manifest.id))
        await asyncio.sleep(self.load_s)
        if self.fail_starts:
            raise self.fail_starts.pop(0)
        if self.fail:
            raise self.fail

    async def stop(self) -> None:
        self.stopped = True
        self.alive = False
        self.log.append(("stop", self.entry.manifest.id))

    async def health_check(self) -> bool:
        return True

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        if self.gate is not None:
            await self.gate.wait()
        self.log.append(("request", self.entry.manifest.id, body.get("tag")))
        if stream and self.streams:
            return UpstreamResponse(200, {"content-type": "text/event-stream"},
                                    stream=self._chunks(body.get("tag")))
        usage = (b'' if self.tokens is None
                 else b', "usage": {"completion_tokens": %d}' % self.tokens)
        return UpstreamResponse(200, {"content-type": "application/json"},
                                body=b'{"ok": true%s}' % usage)

    async def _chunks(self, tag: Any) -> AsyncIterator[bytes]:
        try:
            # with ``tokens``, a short stream whose last event says how many it generated
            for n in range(1000 if self.tokens is None else 3):
                yield b"data: %d\n\n" % n
                await asyncio.sleep(0.01)
            if self.tokens is not None:
                yield b'data: {"usage": {"completion_tokens": %d}}\n\n' % self.tokens
        finally:
            self.log.append(("closed", self.entry.manifest.id, tag))

    async def offload(self):
        return {}

    async def onload(self):
        return {}

    async def report(self):
        return {}

    async def kv_cache_usage(self) -> float | None:
        return self.kv_cache  # what a test sets; None: a worker that does not count it


def coordinator(tmp_path: Path, manifests: list[dict], gpus: list[dict] | None = None,
                **settings: Any) -> tuple[Coordinator, list]:
    log: list = []
    manifest_file = tmp_path / "manifests.yaml"
    import yaml

    for m in (m for m in manifests if "pipeline" not in m):  # a realtime pipeline has none
        m.setdefault("path", str(tmp_path / "weights.gguf"))
    (tmp_path / "weights.gguf").write_bytes(b"GGUF" + b"\0" * 1024)
    manifest_file.write_text(yaml.safe_dump(manifests))
    kwargs = settings.pop("backend_kwargs", {}) if "backend_kwargs" in settings else {}
    config = Settings(manifests=[manifest_file], tasks_file=settings.pop("tasks_file", None),
                      state_dir=tmp_path / "state",
                      models_dir=tmp_path / "models",
                      gpus=gpus or [{"index": 0, "name": "sim", "vram_mb": 4096}],
                      use_nvml=False,
                      **{"reclaim_sleep_s": 0, "spare_workers": False, **settings})
    coord = Coordinator(config, backend_factory=lambda entry, s: FakeBackend(entry, s, log,
                                                                             **kwargs),
                        job_work=run_job)
    return coord, log


@contextlib.asynccontextmanager
async def started_client(coord: Coordinator) -> AsyncIterator[httpx.AsyncClient]:
    """The coordinator started, and a client of its app in-process (no lifespan, no socket)."""
    from model_boss.api.app import create_app

    app = create_app(coordinator=coord)
    await coord.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as client:
            yield client
    finally:
        await coord.stop()


def manifest(model_id: str, vram_mb: int = 3000, **extra) -> dict:
    return {"id": model_id, "vram_mb": vram_mb, **extra}


__all__ = ["Catalog", "FakeBackend", "ModelManifest", "coordinator", "manifest",
           "started_client"]
