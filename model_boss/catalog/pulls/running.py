"""Pulls and removals: models fetched into ``models_dir`` and taken out of it, while running.

A pull runs in a thread (:func:`~.download.pull_files`), one per source at a time (a second
ask for the same source follows the first); its progress goes to whoever asked, and to
``/api/v1/events`` as ``pull_progress``. A finished pull reloads the catalog, which serves the
file under its discovered name. A failed or cancelled pull serves nothing: its bytes so far
stay under ``models_dir`` as ``.partial`` (a file, or a folder's ``ORG/REPO.partial/``), which
discovery never lists, for the next pull of the same source to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from ...errors import BadRequest, ModelBossError, ModelNotFound, NotFound
from ...events import EventBus
from ...settings import Settings
from .. import Catalog
from .download import PullSource, forget_pulls, parse_source, pull_files

log = logging.getLogger(__name__)

Reload = Callable[[str], Awaitable[dict[str, Any]]]
# a model's worker drained and stopped before its files go: (model id, reason)
Unload = Callable[[str, str], Awaitable[object]]
DONE = object()


class Pull:
    """One pull in flight: its last report, and the queues of those following it."""

    def __init__(self, source: PullSource) -> None:
        self.id = "pull-" + uuid.uuid4().hex[:12]
        self.source = source
        self.started_at = time.time()
        self.last: dict[str, Any] = {"status": "queued"}
        self.followers: list[asyncio.Queue] = []
        self.cancelled = threading.Event()
        self.task: asyncio.Task | None = None

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "source": str(self.source), "started_at": self.started_at,
                **self.last}


class Pulls:
    def __init__(self, settings: Settings, catalog: Catalog, events: EventBus, reload: Reload,
                 unload: Unload) -> None:
        self.settings = settings
        self.catalog = catalog
        self.unload = unload
        self.events = events
        self.reload = reload
        self.active: dict[str, Pull] = {}  # by source

    def status(self) -> list[dict[str, Any]]:
        return [pull.view() for pull in self.active.values()]

    async def follow(self, text: Any) -> AsyncIterator[dict[str, Any]]:
        """Start (or join) the pull of ``text``; yields its reports, the last one
        ``{"status": "success", "model": ...}``. A bad source raises before the first."""
        source = parse_source(text)
        pull = self.active.get(str(source))
        if pull is None:
            pull = self.active[str(source)] = Pull(source)
            pull.task = asyncio.create_task(self._run(pull), name=pull.id)
        queue: asyncio.Queue = asyncio.Queue()
        pull.followers.append(queue)
        queue.put_nowait(pull.last)
        try:
            while (item := await queue.get()) is not DONE:
                yield item
            assert pull.task is not None
            yield await pull.task  # its answer, or its error raised here
        finally:
            with contextlib.suppress(ValueError):
                pull.followers.remove(queue)

    async def pull(self, text: Any) -> dict[str, Any]:
        reports = [report async for report in self.follow(text)]
        return reports[-1]

    def cancel(self, pull_id: str) -> dict[str, Any]:
        for pull in self.active.values():
            if pull.id == pull_id:
                pull.cancelled.set()
                return pull.view()
        raise NotFound(f"no pull '{pull_id}' is in flight", code="pull_not_found")

    def _publish(self, pull: Pull, report: dict[str, Any]) -> None:
        pull.last = report
        for queue in pull.followers:
            queue.put_nowait(report)
        # the pull's id and source win over a report's own (a resolving report names it)
        self.events.emit("pull_progress", **{**report, "pull": pull.id,
                                             "source": str(pull.source)})

    async def _run(self, pull: Pull) -> dict[str, Any]:
        loop = asyncio.get_running_loop()

        def report(item: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(self._publish, pull, item)

        models = self.settings.models_path
        endpoint = self.settings.hf_endpoint or None
        try:
            path = await asyncio.to_thread(pull_files, pull.source, models, report,
                                           pull.cancelled, endpoint)
            await self.reload(f"pull of {pull.source}")
            entry = next((e for e in self.catalog if e.path == path), None)
            if entry is None:
                raise BadRequest(f"{path.name} was pulled but is not served: discovery is "
                                 "off (discover: false), or a manifest uses its name",
                                 status_code=409, code="pull_not_served")
            answer = {"status": "success", "model": entry.manifest.id,
                      "path": path.relative_to(models).as_posix()}
            self.events.emit("pulled", pull=pull.id, source=str(pull.source),
                             model=entry.manifest.id)
            return answer
        except Exception as exc:
            if not isinstance(exc, ModelBossError):  # a disk error, say: logged in full
                log.exception("pull of %s failed", pull.source)
                exc = ModelBossError(f"pull of {pull.source} failed: {type(exc).__name__} "
                                     "(the server log says more)")
            self.events.emit("pull_failed", pull=pull.id, source=str(pull.source),
                             error=exc.message)
            log.warning("pull of %s failed: %s", pull.source, exc.message)
            raise exc from None
        finally:
            self.active.pop(str(pull.source), None)
            for queue in pull.followers:
                queue.put_nowait(DONE)

    async def remove(self, name: str) -> dict[str, Any]:
        """Delete a discovered or pulled model's files, after draining and stopping its
        worker; a manifest's model is refused (its YAML says it exists)."""
        entry = self.catalog.get(name)
        manifest = entry.manifest
        if manifest.source == "manifest":
            raise BadRequest(f"'{manifest.id}' is defined by {manifest.source_file}: remove it "
                             "there (model-boss removes only discovered and pulled files)",
                             param="model", code="model_has_manifest")
        if entry.path is None or not entry.path.exists():
            raise ModelNotFound(f"the files of '{manifest.id}' are gone already",
                                param="model")
        await self.unload(manifest.id, "removed")
        removed = self._files(entry.path)
        for path in removed:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        forget_pulls(self.settings.models_path, removed)
        answer = await self.reload(f"removal of {manifest.id}")
        self.events.emit("model_deleted", model=manifest.id)
        return {"model": manifest.id, "deleted": [p.name for p in removed], **answer}

    @staticmethod
    def _files(path: Path) -> list[Path]:
        """The model's files: a split model's every part (its projector stays: the other
        quantizations beside it may use it)."""
        from ..discovery import SPLIT

        split = SPLIT.match(path.name[:-len(".gguf")]) if path.name.endswith(".gguf") else None
        if not split:
            return [path]
        return sorted(p for p in path.parent.iterdir()
                      if (m := SPLIT.match(p.name[:-len(".gguf")])) and m["name"] == split["name"])
