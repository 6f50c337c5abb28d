"""Adapters on their base: a LoRA is a model of its own id that runs on its base model's
loaded worker, never a second copy of the base.

A base's adapters come from its manifest (``adapters: [{id, path, scale}]``) or from the
models folder (discovery pairs them). Each becomes a catalog entry whose manifest is the
base's under the adapter's id, with ``base`` set: listed, scoped and routed by its own name,
served on the base's slot with the adapter applied to that request only
(:func:`on_base`). Its worker has every adapter of its base loaded from the start and
applies none unless a request asks (llama.cpp's ``--lora-init-without-apply`` and
per-request ``lora``; diffusers' ``load_lora_weights`` and ``set_adapters``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf_header import read_metadata
from .manifest import AdapterSpec, BackendKind, ModelManifest

ADAPTER_BACKENDS = (BackendKind.LLAMA_SERVER, BackendKind.DIFFUSERS)


@dataclass(frozen=True, slots=True)
class Adapter:
    """An adapter as its base's worker knows it: its place in the worker's list (llama.cpp
    numbers adapters by the order of ``--lora``), its file and scale."""

    id: str
    base: str
    index: int
    path: Path
    scale: float

    @property
    def worker_name(self) -> str:
        """Its name in a diffusers worker (peft's adapter names take no dots or slashes,
        which model ids may have)."""
        return f"lora{self.index}"


def adapter_manifest(base: ModelManifest, spec: AdapterSpec) -> ModelManifest:
    """The manifest an adapter is served under: its base's, under its own id and aliases,
    never pinned or preloaded on its own (its base is what loads)."""
    return base.model_copy(update={"id": spec.id, "aliases": list(spec.aliases),
                                   "adapters": [], "base": base.id, "pin": False},
                           deep=True)


def adapters_of(base: ModelManifest, base_path: Path | None, base_problem: str | None,
                models_dir: Path) -> list[tuple[AdapterSpec, Adapter, str | None]]:
    """A base's adapters with why each cannot be served (None: it can), numbered in the
    order its worker loads them: only the servable ones are given to the worker, so a
    broken adapter never stops its base from loading."""
    found = []
    index = 0
    for spec in base.adapters:
        path = Path(spec.path).expanduser()
        path = path if path.is_absolute() else models_dir / path
        problem = _problem(base, base_path, base_problem, path)
        found.append((spec, Adapter(spec.id, base.id, -1 if problem else index, path,
                                    spec.scale), problem))
        index += problem is None
    return found


def _problem(base: ModelManifest, base_path: Path | None, base_problem: str | None,
             path: Path) -> str | None:
    """Why an adapter cannot be served: its base cannot, its base's kind takes none, its
    file is missing or is no adapter of the base's architecture (read from its header, so a
    broken file is found before it could fail the base's load)."""
    if base_problem:
        return f"its base '{base.id}' is unavailable: {base_problem}"
    if base.backend not in ADAPTER_BACKENDS:
        return f"its base '{base.id}' ({base.backend}) takes no adapters"
    if not path.exists():
        return f"adapter file not found: {path}"
    if base.backend == BackendKind.LLAMA_SERVER:
        return gguf_adapter_problem(path, base_path)
    return safetensors_problem(path)


def gguf_adapter_problem(path: Path, base_path: Path | None) -> str | None:
    """A LoRA GGUF must say it is one (``general.type: adapter``) for its base's
    architecture."""
    try:
        meta = read_metadata(path)
    except (OSError, ValueError) as exc:
        return f"cannot read the adapter's GGUF header: {exc}"
    if meta.get("general.type") != "adapter":
        return f"{path.name} is no adapter (its general.type is {meta.get('general.type')!r})"
    arch = meta.get("general.architecture")
    try:
        base_arch = read_metadata(base_path).get("general.architecture") if base_path else None
    except (OSError, ValueError):
        base_arch = None
    if base_arch is not None and arch != base_arch:
        return f"{path.name} is an adapter for '{arch}', its base is '{base_arch}'"
    return None


def safetensors_problem(path: Path) -> str | None:
    """A diffusers LoRA: a safetensors file (or a folder holding
    ``pytorch_lora_weights.safetensors``) whose header reads and names LoRA weights."""
    file = path / "pytorch_lora_weights.safetensors" if path.is_dir() else path
    try:
        with file.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if not 2 <= size <= 100_000_000:
                raise ValueError("not a safetensors file")
            names = json.loads(handle.read(size))
    except (OSError, ValueError) as exc:
        return f"cannot read the LoRA's safetensors header ({file.name}): {exc}"
    if not any("lora" in name for name in names):
        return f"{file.name} holds no LoRA weights"
    return None


def on_base(adapter: Adapter | None, loaded: tuple[Adapter, ...], backend: BackendKind,
            body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the base's worker takes it with ``adapter`` applied to this request only
    (None: the base itself), ``loaded`` being every adapter its worker has. llama.cpp: the
    per-request ``lora`` names every one of them, the asked one at its scale and the rest
    at 0, on the base's requests too: its prompt caches are keyed by tokens alone, so a
    request that named none would reuse what an adapter's request left in its slot (a base
    request's own ``lora`` is left as it is). The diffusers worker: ``adapter``."""
    if backend == BackendKind.LLAMA_SERVER:
        if not loaded or (adapter is None and "lora" in body):
            return body
        chosen = adapter.index if adapter is not None else -1
        return {**body, "lora": [{"id": a.index, "scale": a.scale if a.index == chosen else 0.0}
                         for a in loaded]}
    if adapter is None:
        return body
    return {**body, "adapter": adapter.worker_name, "adapter_scale": adapter.scale}


def adapter_header(path: Path) -> dict[str, Any] | None:
    """A GGUF's header when the file is a LoRA adapter (``general.type: adapter``)."""
    try:
        meta = read_metadata(path)
    except (OSError, ValueError):
        return None
    return meta if meta.get("general.type") == "adapter" else None


def pair(adapter: Path, header: dict[str, Any], bases: list[ModelManifest]
         ) -> ModelManifest | None:
    """The discovered base an adapter file belongs to: one named in its file name
    (``BASE.ADAPTER.gguf``), one whose folder of adapters holds it (``BASE.adapters/``, beside
    ``BASE.gguf``), or the one model whose header's name is the adapter's base model's
    (``general.base_model.0.name``, as llama.cpp's converter writes it)."""
    by_stem = {Path(m.path).stem.lower(): m for m in bases
               if m.path and m.backend == BackendKind.LLAMA_SERVER}
    stem = adapter.stem.lower()
    if "." in stem and stem.rsplit(".", 1)[0] in by_stem:
        return by_stem[stem.rsplit(".", 1)[0]]
    folder = adapter.parent.name.lower()
    if folder.endswith(".adapters") and folder.removesuffix(".adapters") in by_stem:
        return by_stem[folder.removesuffix(".adapters")]
    wanted = header.get("general.base_model.0.name")
    if not isinstance(wanted, str):
        return None
    named = []
    for manifest in by_stem.values():
        try:
            if read_metadata(Path(manifest.path)).get("general.name") == wanted:
                named.append(manifest)
        except (OSError, ValueError):
            continue
    return named[0] if len(named) == 1 else None


def attach(bases: list[ModelManifest], adapters: list[tuple[str, Path, dict[str, Any]]]
           ) -> list[ModelManifest]:
    """Discovered adapter files (id, path, header) added to their discovered bases'
    ``adapters``; one whose base is not found is listed, unavailable, saying so."""
    unpaired = []
    for adapter_id, path, header in adapters:
        base = pair(path, header, bases)
        if base is not None and not any(s.id == adapter_id for s in base.adapters):
            base.adapters.append(AdapterSpec(id=adapter_id, path=str(path)))
            continue
        unpaired.append(ModelManifest(
            id=adapter_id, path=str(path), source="discovered",
            problem=f"a LoRA adapter whose base is not here (name it BASE.ADAPTER.gguf, put "
                    f"it in BASE.adapters/ beside BASE.gguf, or list it in its base's "
                    f"manifest: adapters); its header names "
                    f"{header.get('general.base_model.0.name') or 'no base'}"))
    return unpaired


VOCAB_SIZE_SLACK = 128  # llama.cpp's own bound on a draft's vocabulary size difference
_TOKENIZER = ("tokenizer.ggml.model", "tokenizer.ggml.pre")


def draft_problem(base: Path, draft: Path) -> str | None:
    """Why ``draft`` cannot draft for ``base``, read from both headers before a load: no file,
    another tokenizer (its kind and pre-tokenizer), or vocabularies whose sizes differ by more
    than llama.cpp allows (which then compares the tokens themselves at load); None when it
    can."""
    if not draft.is_file():
        return f"draft model not found: {draft}"
    try:
        ours = read_metadata(base, stop_at_vocabulary=False)
        theirs = read_metadata(draft, stop_at_vocabulary=False)
    except (OSError, ValueError) as exc:
        return f"cannot read the draft's or the model's GGUF header: {exc}"

    def said(meta: dict[str, Any]) -> tuple[Any, ...]:
        tokens = meta.get("tokenizer.ggml.tokens")
        size = tokens if isinstance(tokens, int) else len(tokens or [])
        return (*(meta.get(key) for key in _TOKENIZER), size)

    mine, its = said(ours), said(theirs)
    if mine[:2] != its[:2] or abs(mine[2] - its[2]) > VOCAB_SIZE_SLACK:
        return (f"the draft {draft.name} does not share the vocabulary of {base.name} "
                f"(tokenizer {its[0]}/{its[1]}, {its[2]} tokens against {mine[0]}/{mine[1]}, "
                f"{mine[2]})")
    return None
