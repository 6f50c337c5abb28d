"""What the catalog holds: the manifests, the models discovered under ``models_dir``, each
discovered file a manifest names overlaid by it, and how one catalog differs from the next."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..settings import Settings
from .catalog import Catalog
from .context import ContextFit, served_contexts
from .discovery import discover
from .extras import default_llama_worker
from .manifest import ModelManifest, load_manifests

log = logging.getLogger(__name__)

# changes a running worker does not need to restart for: they apply at once
SOFT_FIELDS = frozenset({"aliases", "pin", "stay_warm_s", "priority", "max_concurrency",
                         "max_queued", "thinking"})


def _absolute(path: str | Path, models_dir: Path) -> str:
    """The path's absolute form, symlinks kept (two links to one file are two models)."""
    path = Path(path).expanduser()
    return os.path.abspath(path if path.is_absolute() else models_dir / path)


def overlay(found: ModelManifest, manifest: ModelManifest) -> ModelManifest:
    """``found`` (discovered) with every field ``manifest`` sets taken from the manifest."""
    data = found.model_dump()
    data.update({name: getattr(manifest, name) for name in manifest.model_fields_set})
    merged = ModelManifest.model_validate(data)
    merged.source_file = manifest.source_file
    merged.ctx_from = manifest.ctx_from or found.ctx_from  # the manifest's ctx_size wins
    return merged


def merge(manifests: list[ModelManifest], found: list[ModelManifest],
          models_dir: Path) -> list[ModelManifest]:
    """Manifests first (each overlaying the discovered file its ``path`` names), then the
    discovered models no manifest names. A discovered name a manifest already uses is left
    out (logged): the manifest is the one asked for by that name."""
    by_path = {_absolute(f.path, models_dir): f for f in found if f.path}
    named: set[str] = set()
    merged = []
    for manifest in manifests:
        key = _absolute(manifest.path, models_dir) if manifest.path else None
        if key in by_path:
            named.add(key)
            merged.append(overlay(by_path[key], manifest))
        else:
            merged.append(manifest)
    taken = {name for m in manifests for name in m.names}
    for model in found:
        if _absolute(model.path or "", models_dir) in named:
            continue
        if model.id in taken:
            log.warning("discovered %s is not served as '%s': a manifest uses that name",
                        model.path, model.id)
            continue
        taken.add(model.id)
        merged.append(model)
    return merged


def read_models(settings: Settings, fit: ContextFit | None = None) -> list[ModelManifest]:
    """Every model the settings describe, each llama.cpp model with the context it is served
    with (:mod:`.context`; ``fit`` lowers a trained context the GPUs cannot hold).
    ConfigError (naming the file and the field) when a manifest cannot be read; the default
    manifests folder may be missing."""
    sources = settings.manifests
    if "manifests" not in settings.model_fields_set:
        sources = [s for s in sources if s.expanduser().exists()]
    models = load_manifests(sources)
    if settings.discover:
        models = merge(models, discover(settings.models_path, settings.default_ctx_size),
                       settings.models_path)
    return served_contexts(models, settings.models_path, settings.default_ctx_size, fit)


def build_catalog(settings: Settings, fit: ContextFit | None = None) -> Catalog:
    return Catalog(read_models(settings, fit), settings.models_path,
                   llama_default=default_llama_worker(settings))


@dataclass(slots=True)
class CatalogDiff:
    """How ``new`` differs from ``old``, by model id."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)  # changed in what the worker runs with

    def to_dict(self) -> dict[str, list[str]]:
        return {"added": self.added, "changed": self.changed, "removed": self.removed}

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


def _fields(entry) -> dict:
    return {**entry.manifest.model_dump(), "path": str(entry.path) if entry.path else None,
            "source": entry.manifest.source, "problem": entry.manifest.problem}


def diff_catalogs(old: Catalog, new: Catalog) -> CatalogDiff:
    """Added, changed and removed models; ``restart``: the changed ones whose running worker
    would have to restart to take the change."""
    diff = CatalogDiff()
    before = {e.manifest.id: e for e in old}
    after = {e.manifest.id: e for e in new}
    diff.added = [m for m in after if m not in before]
    diff.removed = [m for m in before if m not in after]
    for model_id in after.keys() & before.keys():
        was, now = _fields(before[model_id]), _fields(after[model_id])
        if was != now:
            diff.changed.append(model_id)
            if any(was[k] != now[k] for k in now if k not in SOFT_FIELDS):
                diff.restart.append(model_id)
    diff.changed.sort()
    diff.restart.sort()
    return diff
