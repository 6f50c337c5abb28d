"""Prompt caches kept across swaps: a llama.cpp model's slots saved on the way out (eviction,
unload, shutdown; never after a crash) through llama.cpp's own slot API, and restored on the
way in before the slot takes requests, so the first request after a swap back skips the
prefill its prompt already paid.

Files live on *shelves*: ``<root>/<model>/<fingerprint>/``, the fingerprint a hash of what a
saved KV cache is only valid for (the model file's path, size and mtime, the context size,
the slots, the KV cache types, flash attention, the projector and the llama.cpp build). A load
passes its shelf to llama.cpp as ``--slot-save-path``, so a file is only ever restored into
the same model and settings. A save is written as ``<slot>-<n>.partial``, renamed to ``.bin``
and then described in ``.json`` (renamed into place last): a save cut short by a crash or a
kill leaves a ``.partial`` or a ``.bin`` without its ``.json``, which is never restored and is
removed. Files are private to the coordinator's user. The cache is bounded by
``prompt_cache_mb``, least recently used files first out (:func:`over_bound`, a pure decision
over the files' sizes and times): at start (a lowered bound takes effect then; what a killed
coordinator left half-written goes too), and before each save, which first makes room for the
file it is about to write (its size foreseen from the bytes per token of the saves already
made; a model's very first save, with nothing to foresee it by, is checked right after it).
Saves are one at a time, so two swaps never both count on the same room.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

log = logging.getLogger(__name__)

MB = 2**20
ZERO = {"saves": 0, "restores": 0, "restored_tokens": 0, "reused_tokens": 0}
MARGIN = 1.1  # a foreseen file's size, with room to spare (the slot may hold a few more tokens)


@dataclass(frozen=True, slots=True)
class Saved:
    """One saved slot on disk: its KV file, size and when it was last saved or restored."""

    path: Path
    size: int
    used_at: float


def over_bound(files: Iterable[Saved], bound_bytes: int) -> list[Saved]:
    """The files to remove so the rest fit in ``bound_bytes``: least recently used first."""
    ordered = sorted(files, key=lambda f: (f.used_at, str(f.path)))
    total = sum(f.size for f in ordered)
    out: list[Saved] = []
    for saved in ordered:
        if total <= bound_bytes:
            break
        out.append(saved)
        total -= saved.size
    return out


def fingerprint(fields: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()[:20]


def _safe(model_id: str) -> str:
    """A model id as one folder name (ids may hold ':' and '/')."""
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
    return f"{keep}-{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"


class PromptCache:
    """The cache of every llama.cpp model on this coordinator; one per pool."""

    def __init__(self, root: Path, bound_mb: int, min_tokens: int, save_s: float) -> None:
        self.root = root
        self.bound_bytes = bound_mb * MB
        self.min_tokens = min_tokens
        self.save_s = save_s
        self.counts: dict[str, dict[str, int]] = {}  # model → saves, restores, restored_tokens
        self.timings: dict[str, dict[str, float]] = {}  # model → last save_s, restore_s
        self._lock = asyncio.Lock()  # one save at a time: each makes room for its own file
        self.closed = False  # a stop in a hurry (a second signal): nothing more is saved
        self.sweep()

    @property
    def enabled(self) -> bool:
        return self.bound_bytes > 0

    def shelf(self, model_id: str, fields: dict[str, Any]) -> Path:
        """The folder of ``model_id``'s saves under these settings, made private."""
        path = self.root / _safe(model_id) / fingerprint(fields)
        path.mkdir(parents=True, exist_ok=True)
        for folder in (self.root, path.parent, path):
            with contextlib.suppress(OSError):
                folder.chmod(0o700)
        return path

    def _count(self, model_id: str, **add: int) -> None:
        counts = self.counts.setdefault(model_id, dict(ZERO))
        for name, value in add.items():
            counts[name] += value

    def close(self) -> None:
        """Save nothing more: a save under way stops before its next slot."""
        self.closed = True

    def note_reused(self, model_id: str, tokens: int) -> None:
        """A finished worker's ``prompt_tokens_cached_total`` (llama.cpp's ``/metrics``):
        prompt tokens it reused from any cache: its slot's KV, its RAM prompt cache
        (``--cache-ram``) or a restored save. llama.cpp counts no RAM cache hits apart."""
        self._count(model_id, reused_tokens=max(0, tokens))

    # -- the way out ---------------------------------------------------------------------

    async def save(self, client: httpx.AsyncClient, shelf: Path, model_id: str) -> int:
        """Save every slot holding at least ``min_tokens`` of prompt, within ``save_s``;
        returns how many were saved. Never raises: a swap does not wait on a failed save."""
        saved = 0
        if self.closed:
            return 0
        try:
            async with asyncio.timeout(self.save_s), self._lock:
                self.tidy(shelf)
                reply = await client.get("/slots")
                slots = reply.json() if reply.status_code == 200 else []
                started = time.perf_counter()
                for slot in slots if isinstance(slots, list) else []:
                    tokens = int(slot.get("n_prompt_tokens") or 0)
                    if self.closed:
                        break
                    if tokens < self.min_tokens:
                        continue
                    decoded = sum(int(t.get("n_decoded") or 0)
                                  for t in slot.get("next_token") or [] if isinstance(t, dict))
                    if self.make_room(shelf, tokens + decoded, int(slot["id"])):
                        saved += await self._save_slot(client, shelf, model_id, int(slot["id"]))
                    self.enforce()
                if saved:
                    self.timings.setdefault(model_id, {})["last_save_s"] = round(
                        time.perf_counter() - started, 3)
        except (TimeoutError, httpx.HTTPError, ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("prompt cache of %s not saved: %s", model_id, exc)
        self.enforce()
        return saved

    def make_room(self, shelf: Path, tokens: int, slot: int = 0) -> bool:
        """Remove saves so a save of ``tokens`` fits beside the rest: first the slot's older
        saves it replaces, then the least recently used; False when it could not fit even
        alone (it is not made). Its size is foreseen from the saves already on disk (this
        shelf's, else any); with none, nothing is foreseen."""
        rate = self.bytes_per_token(shelf)
        if rate is None:
            return True
        need = int(rate * tokens * MARGIN) + 4096
        if need > self.bound_bytes:
            log.info("a prompt of %d tokens (%d MB) does not fit in the prompt cache", tokens,
                     need // MB)
            return False
        files = self.files()
        if sum(f.size for f in files) <= self.bound_bytes - need:
            return True
        replaced = [f for f in files if f.path.parent == shelf
                    and f.path.stem.split("-", 1)[0] == str(slot)]
        rest = [f for f in files if f not in replaced]
        for saved in replaced + over_bound(rest, self.bound_bytes - need):
            self._remove(saved.path)
        return True

    def bytes_per_token(self, shelf: Path) -> float | None:
        """The most bytes per token of the saves on ``shelf``, else of every save."""
        for metas in (list(shelf.glob("*.json")), list(self.root.rglob("*.json"))):
            rates = []
            for meta in metas:
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    data = orjson.loads(meta.read_bytes())
                    if int(data["tokens"]) > 0:
                        rates.append(int(data["bytes"]) / int(data["tokens"]))
            if rates:
                return max(rates)
        return None

    async def _save_slot(self, client: httpx.AsyncClient, shelf: Path, model_id: str,
                         slot: int) -> int:
        stem = f"{slot}-{time.time_ns()}"
        partial = shelf / f"{stem}.partial"
        try:
            reply = await client.post(f"/slots/{slot}?action=save",
                                      json={"filename": partial.name})
            answer = reply.json()
            if reply.status_code != 200 or not partial.exists():
                raise ValueError(f"llama.cpp answered {reply.status_code}: {reply.text[:200]}")
            final = partial.with_suffix(".bin")
            partial.chmod(0o600)
            partial.rename(final)
            meta = {"model": model_id, "slot": slot, "tokens": int(answer.get("n_saved", 0)),
                    "bytes": final.stat().st_size, "saved_at": time.time(),
                    "save_ms": (answer.get("timings") or {}).get("save_ms")}
            staged = shelf / f"{stem}.json.tmp"
            staged.write_bytes(orjson.dumps(meta))
            staged.chmod(0o600)
            staged.rename(shelf / f"{stem}.json")  # described last: now it may be restored
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
        for older in self._saves(shelf):  # one save per slot: the newest
            if older.stem.split("-", 1)[0] == str(slot) and older.stem != stem:
                self._remove(older)
        self._count(model_id, saves=1)
        return 1

    # -- the way in ----------------------------------------------------------------------

    async def restore(self, client: httpx.AsyncClient, shelf: Path, model_id: str,
                      slots: int) -> int:
        """Restore each slot's newest complete save; returns the tokens restored. A file
        llama.cpp refuses is removed. Never raises."""
        self.tidy(shelf)
        restored = 0
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.save_s):
                for path in self._saves(shelf):
                    slot = int(path.stem.split("-", 1)[0])
                    if slot >= slots:
                        continue
                    reply = await client.post(f"/slots/{slot}?action=restore",
                                              json={"filename": path.name})
                    if reply.status_code != 200:
                        log.warning("prompt cache %s of %s refused (%s): removed", path.name,
                                    model_id, reply.status_code)
                        self._remove(path)
                        continue
                    tokens = int(reply.json().get("n_restored") or 0)
                    now = time.time()
                    os.utime(path, (now, now))  # recently used: last out
                    restored += tokens
                    self._count(model_id, restores=1, restored_tokens=tokens)
        except (TimeoutError, httpx.HTTPError, ValueError, OSError) as exc:
            log.warning("prompt cache of %s not restored: %s", model_id, exc)
        if restored:
            self.timings.setdefault(model_id, {})["last_restore_s"] = round(
                time.perf_counter() - started, 3)
        return restored

    # -- files ---------------------------------------------------------------------------

    def _saves(self, shelf: Path) -> list[Path]:
        """The complete saves on a shelf (a ``.bin`` with its ``.json``), newest first."""
        found = [p for p in shelf.glob("*.bin") if p.with_suffix(".json").exists()]
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)

    def tidy(self, shelf: Path) -> None:
        """Remove what a cut-short save left: ``.partial`` files, staged descriptions and
        ``.bin`` files without theirs."""
        for path in shelf.iterdir() if shelf.is_dir() else []:
            incomplete = path.suffix in (".partial", ".tmp") or (
                path.suffix == ".bin" and not path.with_suffix(".json").exists()) or (
                path.suffix == ".json" and not path.with_suffix(".bin").exists())
            if incomplete:
                with contextlib.suppress(OSError):
                    path.unlink()

    def _remove(self, path: Path) -> None:
        for each in (path, path.with_suffix(".json")):
            with contextlib.suppress(OSError):
                each.unlink()

    def files(self, model_id: str | None = None) -> list[Saved]:
        """The saves (of one model, or all): each ``.bin``'s size counts its ``.json`` too."""
        base = self.root / _safe(model_id) if model_id else self.root
        out = []
        for path in base.rglob("*.bin") if base.is_dir() else []:
            with contextlib.suppress(OSError):
                stat = path.stat()
                meta = path.with_suffix(".json")
                extra = meta.stat().st_size if meta.exists() else 0
                out.append(Saved(path, stat.st_size + extra, stat.st_mtime))
        return out

    def sweep(self) -> list[Saved]:
        """At start: what cut-short saves left goes, then the least recently used saves over
        the bound (all models, all settings: a lowered ``prompt_cache_mb`` takes effect now),
        then the folders left empty. Returns the saves removed."""
        if not self.root.is_dir():
            return []
        for shelf in [p for p in self.root.glob("*/*") if p.is_dir()]:
            self.tidy(shelf)
        removed = self.enforce()
        for folder in sorted(self.root.glob("*/*"), reverse=True) + sorted(
                self.root.glob("*")):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
        return removed

    def enforce(self) -> list[Saved]:
        """Remove the least recently used saves until the cache fits its bound."""
        removed = over_bound(self.files(), self.bound_bytes)
        for saved in removed:
            self._remove(saved.path)
        return removed

    def clear(self, model_id: str) -> dict[str, Any]:
        """Remove every save of ``model_id`` (all its shelves)."""
        files = self.files(model_id)
        shutil.rmtree(self.root / _safe(model_id), ignore_errors=True)
        return {"removed_files": len(files), "freed_mb": round(sum(f.size for f in files) / MB,
                                                                  1)}

    def stats(self, model_id: str) -> dict[str, Any]:
        files = self.files(model_id)
        return {"enabled": self.enabled, "files": len(files),
                "mb": round(sum(f.size for f in files) / MB, 1),
                **self.counts.get(model_id, ZERO),
                **self.timings.get(model_id, {})}
