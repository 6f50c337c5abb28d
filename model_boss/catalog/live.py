"""LiveCatalog: the catalog and the tasks kept in step with their files while running.

Manifests, ``tasks_file`` and ``models_dir`` are watched (watchfiles); a change, a SIGHUP or
``POST /api/v1/reload`` reads everything again. The new catalog is built and checked whole
first: a file that fails to parse keeps the previous catalog and tasks untouched, and the error
(naming the file and the field) is kept for ``/api/v1/status``. A good one is adopted in one
step; then the slots follow (``follow``, wired to
:func:`~model_boss.slots.changes.take_catalog_change`): a removed model is
drained and stopped, a changed one whose worker flags changed is drained and reloaded at its
next request, any other change applies at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..events import EventBus
from ..settings import Settings
from . import Catalog, CatalogDiff, ContextFit, build_catalog, diff_catalogs
from .discovery import PARTIAL_SUFFIXES, PULLS_FILE
from .tasks import TaskRegistry

log = logging.getLogger(__name__)

# what the slots do once a changed catalog is adopted: drain and stop the removed models, ...
Follow = Callable[[CatalogDiff], Awaitable[None]]


class LiveCatalog:
    """Reloads ``catalog`` and ``tasks`` in place (everyone holds these same objects)."""

    def __init__(self, settings: Settings, catalog: Catalog, tasks: TaskRegistry,
                 events: EventBus, follow: Follow, fit: ContextFit | None = None) -> None:
        self.settings = settings
        self.fit = fit  # the contexts' fit to the GPUs, as the first catalog was built with
        self.catalog = catalog
        self.tasks = tasks
        self.follow = follow
        self.events = events
        self.errors: list[str] = []  # why the last reload kept the previous catalog
        self.reloaded_at: float | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._sighup = False

    async def reload(self, trigger: str = "api") -> dict[str, Any]:
        """Read every file again; the answer: ``{added, changed, removed, errors}``."""
        async with self._lock:
            try:
                new = await asyncio.to_thread(build_catalog, self.settings, self.fit)
                tasks = TaskRegistry.load(self.settings.tasks_file, new)
            except (ConfigError, Exception) as exc:  # whatever it was, nothing changes
                self.errors = [exc.message if isinstance(exc, ConfigError)
                               else f"reading the catalog failed: {type(exc).__name__}: {exc}"]
                log.error("reload (%s) kept the previous catalog: %s", trigger, self.errors[0])
                self.events.emit("reload_failed", trigger=trigger, errors=self.errors)
                return {"added": [], "changed": [], "removed": [], "errors": self.errors}
            diff = diff_catalogs(self.catalog, new)
            self.catalog.adopt(new)
            self.tasks.adopt(tasks)
            self.errors = []
            self.reloaded_at = time.time()
        if diff:
            log.info("catalog reloaded (%s): added %s, changed %s, removed %s", trigger,
                     diff.added, diff.changed, diff.removed)
            self.events.emit("catalog_reloaded", trigger=trigger, **diff.to_dict())
            self._spawn(self.follow(diff))
        return {**diff.to_dict(), "errors": []}

    def status(self) -> dict[str, Any]:
        sources = Counter(e.manifest.source for e in self.catalog)
        return {"errors": list(self.errors), "reloaded_at": self.reloaded_at,
                "watching": self._watcher is not None and not self._watcher.done(),
                "models": {s: sources.get(s, 0) for s in ("manifest", "discovered", "pulled")}}

    # -- triggers -------------------------------------------------------------------------

    def start(self) -> None:
        if self.settings.discover:
            with contextlib.suppress(OSError):  # watched, so a first file there is seen
                self.settings.models_path.mkdir(parents=True, exist_ok=True)
        if self.settings.watch:
            self._watcher = asyncio.create_task(self._watch(), name="catalog-watch")
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: self._spawn(self.reload("SIGHUP")))
            self._sighup = True

    async def stop(self) -> None:
        if self._sighup:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        self._stop.set()
        tasks = [t for t in (self._watcher, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def watched(self) -> tuple[list[Path], list[Path]]:
        """(folders watched one level deep, folders watched recursively)."""
        flat: set[Path] = set()
        for source in self.settings.manifests:
            source = source.expanduser().absolute()
            flat.add(source if source.is_dir() else source.parent)
        if self.settings.tasks_file is not None:
            flat.add(self.settings.tasks_file.expanduser().absolute().parent)
        deep = [self.settings.models_path.absolute()] if self.settings.discover else []
        return sorted(f for f in flat if f.is_dir()), [d for d in deep if d.is_dir()]

    def relevant(self, path: str) -> bool:
        """A change to this path can change the catalog."""
        file = Path(path)
        name = file.name
        if name == PULLS_FILE:
            return True
        if name.startswith(".") or name.endswith(PARTIAL_SUFFIXES):
            return False
        models = self.settings.models_path.absolute()
        if self.settings.discover and file.is_relative_to(models):
            return True
        tasks = self.settings.tasks_file
        if tasks is not None and file == tasks.expanduser().absolute():
            return True
        for source in self.settings.manifests:
            source = source.expanduser().absolute()
            if file == source or (file.parent == source and file.suffix in (".yaml", ".yml")):
                return True
        return False

    async def _watch(self) -> None:
        from watchfiles import awatch

        flat, deep = self.watched()
        streams = [awatch(*paths, recursive=recursive, stop_event=self._stop,
                          debounce=self.settings.watch_debounce_ms, step=50,
                          watch_filter=lambda _change, path: self.relevant(path))
                   for paths, recursive in ((flat, False), (deep, True)) if paths]
        log.info("watching for catalog changes: %s", ", ".join(map(str, [*flat, *deep])))
        await asyncio.gather(*(self._follow(stream) for stream in streams))

    async def _follow(self, stream) -> None:
        async for changes in stream:
            try:
                await self.reload("file change: " + ", ".join(
                    sorted({Path(p).name for _, p in changes})[:5]))
            except Exception:  # the watcher never dies; the next change retries
                log.exception("reload after a file change failed")
