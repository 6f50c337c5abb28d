"""Catalog: the manifests by id and alias, with each model's availability."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelNotFound, ModelUnavailable
from .adapters import Adapter, adapter_manifest, adapters_of, draft_problem, on_base
from .extras import Importable, module_found, not_installed, requirement
from .manifest import BackendKind, Category, LlamaWorker, ModelManifest
from .pipelines import ip_adapter_path, makes_video, pipeline_class
from .realtime import pipeline_problem


@dataclass(slots=True)
class CatalogEntry:
    manifest: ModelManifest
    path: Path | None
    unavailable_reason: str | None = None
    ip_adapter: Path | None = None  # a diffusers model's IP-Adapter, for reference_images
    adapter: Adapter | None = None  # a LoRA: served on its base's slot (catalog/adapters.py)
    adapters: tuple[Adapter, ...] = ()  # a base's servable adapters, in its worker's order
    found_problem: str | None = None  # what its files say against it (a draft, a kind)
    not_installed: str | None = None  # the extra its kind needs, missing here (extras.py)

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def companions(self, models_dir: Path) -> list[Path]:
        """The files that load with the model in its worker: its adapters, its draft, its
        IP-Adapter (weights and image encoder)."""
        draft = [self.manifest.resolved_draft(models_dir)] if self.manifest.draft else []
        ip = [self.ip_adapter] if self.ip_adapter is not None else []
        return [adapter.path for adapter in self.adapters] + draft + ip


class Catalog:
    """Resolves names (id or alias) to entries; knows which models cannot be served and why.

    ``importable`` says whether this install finds a module (each asked once per catalog);
    ``llama_default`` is the worker a llama model that names none runs on: together they
    tell which models' extras are missing (:mod:`.extras`)."""

    def __init__(self, manifests: list[ModelManifest], models_dir: Path, *,
                 importable: Importable = module_found,
                 llama_default: LlamaWorker = LlamaWorker.NATIVE) -> None:
        self._entries: dict[str, CatalogEntry] = {}
        self._names: dict[str, str] = {}
        importable = functools.cache(importable)
        for manifest in manifests:
            path = manifest.resolved_path(models_dir)
            entry = CatalogEntry(manifest, path, _unavailable_reason(manifest, path))
            if manifest.backend == BackendKind.DIFFUSERS and entry.available:
                _diffusers_kind(entry, models_dir)
            if entry.available:
                entry.not_installed = not_installed(requirement(manifest, llama_default),
                                                    importable)
                entry.unavailable_reason = entry.not_installed
            if manifest.draft and entry.available and path is not None:
                entry.found_problem = draft_problem(path, manifest.resolved_draft(models_dir))
                entry.unavailable_reason = entry.found_problem
            self._add(entry)
            for spec, adapter, problem in adapters_of(manifest, path, entry.unavailable_reason,
                                                      models_dir):
                self._add(CatalogEntry(adapter_manifest(manifest, spec), path, problem,
                                       entry.ip_adapter, adapter))
                entry.adapters += () if problem else (adapter,)
        for entry in self._entries.values():  # a pipeline's models are all known by now
            if entry.manifest.category == Category.REALTIME and entry.available:
                entry.found_problem = pipeline_problem(entry.manifest, self.find)
                entry.unavailable_reason = entry.found_problem

    def _add(self, entry: CatalogEntry) -> None:
        self._entries[entry.manifest.id] = entry
        for name in entry.manifest.names:
            self._names[name] = entry.manifest.id

    def base_of(self, name: str) -> str:
        """The model whose slot serves ``name``: an adapter's base, else ``name``'s own id
        (``name`` itself when unknown)."""
        entry = self.find(name)
        if entry is None:
            return name
        return entry.manifest.base or entry.manifest.id

    def served_on(self, name: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The model whose slot serves ``name`` and the body its worker gets: an adapter's
        base, with the adapter applied to this request (:func:`on_base`)."""
        entry = self.find(name)
        if entry is None:
            return name, body
        if entry.adapter is not None and not entry.available:  # its base could serve: it not
            raise ModelUnavailable(f"The model '{entry.manifest.id}' is unavailable: "
                                   f"{entry.unavailable_reason}", param="model")
        base = self.find(entry.manifest.base) if entry.manifest.base else entry
        if base is None or not base.adapters:
            return base.manifest.id if base else name, body
        return base.manifest.id, on_base(entry.adapter, base.adapters, entry.manifest.backend,
                                         body)

    def adopt(self, other: Catalog) -> None:
        """Take ``other``'s models in one step (a reload): whoever holds this catalog sees the
        new one whole. Readers in threads iterate the old mapping, never a changing one."""
        self._entries, self._names = other._entries, other._names

    def __iter__(self):
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def find(self, name: str) -> CatalogEntry | None:
        model_id = self._names.get(name)
        return self._entries[model_id] if model_id else None

    def get(self, name: str) -> CatalogEntry:
        """The entry for ``name``; 404 when unknown."""
        entry = self.find(name)
        if entry is None:
            raise ModelNotFound(f"The model '{name}' does not exist", param="model")
        return entry

    def get_available(self, name: str) -> CatalogEntry:
        """The entry for ``name``; 404 when unknown, 503 with the reason when unservable."""
        entry = self.get(name)
        if entry.adapter is None:
            entry.unavailable_reason = _unavailable_reason(entry.manifest, entry.path) \
                or entry.found_problem or entry.not_installed
        if entry.unavailable_reason:
            raise ModelUnavailable(
                f"The model '{entry.manifest.id}' is unavailable: {entry.unavailable_reason}",
                param="model",
            )
        return entry


def _diffusers_kind(entry: CatalogEntry, models_dir: Path) -> None:
    """A diffusers folder's own word on what it is: a video pipeline is a video model
    whatever its manifest's category says (it serves /v1/videos only), and its IP-Adapter
    is found where the manifest or the folder puts one."""
    manifest = entry.manifest
    folder = entry.path if entry.path is not None and entry.path.is_dir() else None
    if folder is not None and makes_video(pipeline_class(folder)):
        manifest.category = Category.VIDEO
    elif manifest.category == Category.VIDEO:
        entry.found_problem = "category: video, but its model_index.json names no video " \
                              "pipeline"
        entry.unavailable_reason = entry.found_problem
    entry.ip_adapter = ip_adapter_path(manifest, folder, models_dir)


def _unavailable_reason(manifest: ModelManifest, path: Path | None) -> str | None:
    if manifest.problem:
        return manifest.problem
    if manifest.category == Category.REALTIME:  # its own models say (catalog/realtime.py)
        return None
    if manifest.backend in (BackendKind.LLAMA_SERVER, BackendKind.DIFFUSERS,
                            BackendKind.TRANSFORMERS):
        if path is None:
            return "manifest has no path"
        if not path.exists():
            return f"model file not found: {path}"
    if manifest.backend == BackendKind.TRANSFORMERS and manifest.category not in (
            Category.EMBEDDING, Category.RERANK, Category.STT, Category.TTS):
        return f"the transformers backend serves embedding, rerank, stt and tts models, " \
               f"not {manifest.category}"
    if manifest.backend == BackendKind.COMMAND and not manifest.command:
        return "manifest has no command"
    if manifest.backend == BackendKind.CLOUD and not manifest.base_url:
        return "manifest has no base_url"
    return None
