"""What Ollama's model routes say about models: ``/api/tags`` (every manifest), ``/api/ps``
(loaded ones: size, VRAM from the lease, expiry from the keep-alive deadline) and
``/api/show`` (details, GGUF metadata, capabilities), all read from the catalog and the
pool's status."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...catalog import BackendKind, CatalogEntry, Category
from ...catalog.gguf_header import gguf_tables
from ...gpu.gguf_info import GGUFInfo, read_gguf_info
from .translate import created_at

if TYPE_CHECKING:
    from ...coordinator import Coordinator

MIB = 1024 * 1024
# Ollama writes "forever" (keep_alive < 0) as a time ~292 years ahead; clients show "Forever"
FOREVER = "2318-01-01T00:00:00Z"
_CAPABILITIES = {Category.LLM: ["completion"], Category.EMBEDDING: ["embedding"],
                 Category.VISION: ["completion", "vision"]}


def gguf_of(entry: CatalogEntry) -> GGUFInfo | None:
    path = entry.path
    if entry.manifest.backend != BackendKind.LLAMA_SERVER or path is None or not path.is_file():
        return None
    return read_gguf_info(path)


def parameter_size(count: int) -> str:
    """135M, 7.2B: as Ollama writes a parameter count."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    return f"{round(count / 1e6)}M" if count >= 1_000_000 else str(count)


def quantization(info: GGUFInfo | None) -> str:
    if info is None or info.file_type is None:
        return ""
    try:
        return gguf_tables().LlamaFileType(info.file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(info.file_type)


def details(entry: CatalogEntry) -> dict[str, Any]:
    info = gguf_of(entry)
    family = info.architecture if info else str(entry.manifest.category)
    path = entry.path
    fmt = "gguf" if info else (path.suffix.lstrip(".") if path and path.suffix
                               else str(entry.manifest.backend))
    return {"parent_model": entry.manifest.base or "", "format": fmt, "family": family,
            "families": [family],
            "parameter_size": parameter_size(info.parameter_count) if info else "",
            "quantization_level": quantization(info)}


def digest(entry: CatalogEntry) -> str:
    """The manifest's digest (Ollama's is its manifest's too): changes when the manifest does."""
    return hashlib.sha256(entry.manifest.model_dump_json().encode()).hexdigest()


def _stat(path: Path | None) -> tuple[int, float | None]:
    """The model's bytes (a folder's: its files', links followed as the hub cache makes them)
    and its modification time."""
    try:
        if path is not None:
            stat = path.stat()
            if path.is_file():
                return stat.st_size, stat.st_mtime
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()), stat.st_mtime
    except OSError:
        pass
    return 0, None


def tag(entry: CatalogEntry) -> dict[str, Any]:
    """One ``/api/tags`` row. ``name`` is the manifest's id; its aliases (Ollama tags such as
    ``smollm2:135m``) answer too and are listed in ``aliases``."""
    size, mtime = _stat(entry.adapter.path if entry.adapter else entry.path)
    if mtime is None and entry.manifest.source_file:
        mtime = _stat(Path(entry.manifest.source_file))[1]
    m = entry.manifest
    return {"name": m.id, "model": m.id, "modified_at": created_at(mtime), "size": size,
            "digest": digest(entry), "details": details(entry), "aliases": list(m.aliases),
            "available": entry.available, "source": m.source}


def tags(coord: Coordinator) -> dict[str, Any]:
    return {"models": [tag(entry) for entry in coord.catalog]}


def context_per_request(entry: CatalogEntry) -> int:
    """llama.cpp's server shares ``ctx_size`` among its parallel slots."""
    manifest = entry.manifest
    return max(1, manifest.ctx_size // max(1, manifest.concurrency))


def expires_at(slot: dict[str, Any]) -> str:
    if slot.get("pinned") or slot.get("unload_at") is None:
        return FOREVER
    return created_at(slot["unload_at"])


def ps(coord: Coordinator) -> dict[str, Any]:
    """Every model with a worker (loading, on a GPU, or parked in CPU RAM): ``size`` the
    whole model, ``size_vram`` what its VRAM lease holds, ``expires_at`` its keep-alive
    deadline; ``processor`` says it as ``ollama ps`` does (model-boss's own field)."""
    models = []
    for slot in coord.pool.status():
        if slot["state"] in ("idle", "stopping"):
            continue
        entry = coord.catalog.find(slot["model"])
        if entry is None:  # removed by a reload; its worker is draining
            continue
        split = slot.get("processor") or {}
        models.append({**tag(entry), "size": int(split.get("size_mb", 0)) * MIB,
                       "size_vram": int(split.get("vram_mb", 0)) * MIB,
                       "expires_at": expires_at(slot),
                       "context_length": context_per_request(entry),
                       "processor": split.get("label", "-"), "state": slot["state"]})
    return {"models": models}


def show(entry: CatalogEntry) -> dict[str, Any]:
    """``/api/show``: details, the GGUF's metadata as ``model_info``, the manifest's
    settings as ``parameters`` and a Modelfile-like summary, capabilities."""
    m, info = entry.manifest, gguf_of(entry)
    model_info: dict[str, Any] = {}
    if info is not None:
        arch = info.architecture
        model_info = {"general.architecture": arch,
                      "general.parameter_count": info.parameter_count,
                      f"{arch}.block_count": info.block_count,
                      f"{arch}.context_length": info.context_length,
                      f"{arch}.embedding_length": info.embedding_length,
                      f"{arch}.feed_forward_length": info.feed_forward_length,
                      f"{arch}.attention.head_count": info.head_count,
                      f"{arch}.attention.head_count_kv": info.head_count_kv}
    parameters = f"num_ctx {context_per_request(entry)}"
    capabilities = list(_CAPABILITIES.get(m.category, []))
    if m.embeddings and "embedding" not in capabilities:
        capabilities.append("embedding")
    source = Path(m.path).name if m.path else m.backend
    template = Path(m.chat_template).name if m.chat_template else "(the model's own)"
    if entry.adapter is not None:  # a LoRA on its base, as a Modelfile says one
        source = f"{m.base}\nADAPTER {entry.adapter.path.name}"
    return {"modelfile": f"# model-boss manifest '{m.id}'\nFROM {source}\n"
                         f"PARAMETER {parameters}\n",
            "parameters": parameters, "template": template,
            "details": details(entry), "model_info": model_info,
            "capabilities": capabilities, "modified_at": tag(entry)["modified_at"],
            "license": "", "aliases": list(m.aliases)}
