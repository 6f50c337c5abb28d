"""Realtime pipelines: whether the three models a ``category: realtime`` manifest names can
serve a conversation (each known, of its kind, and servable itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .manifest import Category, ModelManifest


class Servable(Protocol):
    """What a pipeline asks of each of its models' catalog entries."""

    manifest: ModelManifest
    unavailable_reason: str | None

    @property
    def available(self) -> bool: ...


# each role of a pipeline and the kinds of model that fill it
ROLES: dict[str, tuple[Category, ...]] = {
    "transcriber": (Category.STT,),
    "llm": (Category.LLM, Category.VISION),
    "voice": (Category.TTS,),
}


def pipeline_problem(manifest: ModelManifest,
                     find: Callable[[str], Servable | None]) -> str | None:
    """Why the pipeline ``manifest`` names cannot serve (the first role that fails, named with
    its model); None when each of its models is known, of its role's kind and available."""
    if manifest.pipeline is None:
        return None
    for role, kinds in ROLES.items():
        name = getattr(manifest.pipeline, role)
        entry = find(name)
        if entry is None:
            return f"pipeline.{role}: no model '{name}'"
        if entry.manifest.category not in kinds:
            wanted = " or ".join(kinds)
            return (f"pipeline.{role}: '{name}' is a {entry.manifest.category} model, "
                    f"not {wanted}")
        if not entry.available:
            return f"pipeline.{role}: '{name}' is unavailable: {entry.unavailable_reason}"
    return None
