"""The context a llama.cpp model is served with, and where a person changes it.

A manifest's own ``ctx_size`` wins. Without one (a manifest that sets none, or a discovered
GGUF) the model gets the context it was trained with, from its GGUF header
(``<arch>.context_length``), which a :data:`ContextFit` may lower so that its KV cache fits
the GPUs beside its weights (``gpu/context_fit.py``: the coordinator supplies it; the
catalog knows no GPUs). A header that names no context gives ``default_ctx_size``.

A request longer than the context is refused by llama.cpp (``exceed_context_size_error``);
:func:`explain_overflow` adds to that 400 the context the model runs with and the field that
sets it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ModelBossError
from .gguf_header import read_metadata
from .manifest import BackendKind, ModelManifest

# a manifest (without ctx_size, trained context read) and its file → the manifest served
ContextFit = Callable[[ModelManifest, Path], ModelManifest]
# what llama.cpp's refusal ends with: the advice model-boss replaces with its own
_LLAMA_ADVICE = ", try increasing it"


def trained_context(path: Path | None) -> int | None:
    """The context a GGUF was trained with, from its header; None when it names none or
    cannot be read."""
    if path is None:
        return None
    try:
        meta = read_metadata(path)
    except (OSError, ValueError):
        return None
    trained = meta.get(f"{meta.get('general.architecture', '')}.context_length")
    return trained if isinstance(trained, int) and trained > 0 else None


def served_context(manifest: ModelManifest, path: Path | None,
                   default_ctx_size: int) -> ModelManifest:
    """``manifest`` with the context it is served with when no manifest sets ``ctx_size``:
    the trained one, else ``default_ctx_size`` (say which in ``ctx_from``)."""
    if manifest.backend != BackendKind.LLAMA_SERVER or manifest.ctx_from is not None:
        return manifest
    trained = trained_context(path)
    served = manifest.model_copy(update={"ctx_size": max(64, trained or default_ctx_size)})
    served.ctx_from = "trained" if trained else "default"
    return served


def served_contexts(manifests: list[ModelManifest], models_dir: Path, default_ctx_size: int,
                    fit: ContextFit | None = None) -> list[ModelManifest]:
    """Every manifest with its served context: read where no manifest set one, and fitted
    (``fit``) where it is the trained context."""
    served = []
    for manifest in manifests:
        path = manifest.resolved_path(models_dir)
        manifest = served_context(manifest, path, default_ctx_size)
        if fit is not None and manifest.ctx_from == "trained" and path is not None \
                and path.is_file():
            manifest = fit(manifest, path)
        served.append(manifest)
    return served


def _setting(manifest: ModelManifest) -> str:
    """Where a person sets this model's context (a file name only: paths are not told)."""
    if manifest.source_file:
        return f"`ctx_size` in its manifest ({Path(manifest.source_file).name})"
    return ("`ctx_size` in a manifest naming its file (a YAML file in the manifests folder "
            f"with `path: {Path(manifest.path or '').name}`)")


def context_origin(manifest: ModelManifest) -> str:
    """Where a llama.cpp model's context comes from and what changes it, in words."""
    setting = _setting(manifest)
    if manifest.ctx_from == "manifest":
        return f"set by {setting}"
    if manifest.ctx_from == "default":
        return (f"the settings' `default_ctx_size` (its GGUF header names no trained "
                f"context); {setting} sets another")
    if manifest.ctx_note:
        return f"{manifest.ctx_note}; {setting} sets another"
    return f"the context it was trained with (its GGUF header); {setting} sets another"


def context_words(manifest: ModelManifest) -> str:
    """"'smol' runs with a context of 8192 tokens (...), the context it was trained with
    ...": the context, its share per request, and where it is set."""
    slots = manifest.concurrency
    shared = (f" shared by its {slots} parallel slots: {manifest.ctx_size // slots} per "
              "request" if slots > 1 else "")
    return (f"'{manifest.id}' runs with a context of {manifest.ctx_size} tokens{shared}, "
            f"{context_origin(manifest)}")


def is_context_overflow(exc: ModelBossError) -> bool:
    """Whether a worker refused a prompt longer than its context (llama.cpp's
    ``exceed_context_size_error``, mapped to OpenAI's ``context_length_exceeded``)."""
    return exc.code == "context_length_exceeded" \
        or {"n_prompt_tokens", "n_ctx"} <= exc.details.keys()


def explain_overflow(exc: ModelBossError, manifest: ModelManifest) -> ModelBossError:
    """``exc`` (changed in place) saying the model's context and the field that sets it,
    when it is a prompt too long for the context; else as it is."""
    if not is_context_overflow(exc) or manifest.backend != BackendKind.LLAMA_SERVER \
            or "runs with a context of" in exc.message:
        return exc
    exc.message = f"{exc.message.removesuffix(_LLAMA_ADVICE)}: {context_words(manifest)}"
    exc.args = (exc.message,)
    return exc


def context_view(manifest: ModelManifest) -> dict[str, Any]:
    """What a status says of a llama.cpp model's context: its size, its share per request,
    where it comes from and, when lowered from the trained one, why; nothing for others."""
    if manifest.backend != BackendKind.LLAMA_SERVER:
        return {}
    return {"ctx_size": manifest.ctx_size,
            "ctx_per_request": manifest.ctx_size // max(1, manifest.concurrency),
            "ctx_from": manifest.ctx_from, "ctx_note": manifest.ctx_note}
