"""Whether a model's context holds an agent's first prompt and an answer, and what to change
when it does not: a pure decision over the figures, with the manifest to edit found on
disk where it can be."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import yaml

from .agents import Agent
from .daemon import ServedModel

# room for the first answer beyond the prompt: a short reply or a tool call
ANSWER_ROOM = 512
CONTEXT_STEP = 1024  # the context advised is rounded up to this


def needed_context(agent: Agent) -> int | None:
    """The least context worth starting the agent with (``None``: not checked)."""
    if agent.first_prompt is None:
        return None
    return agent.first_prompt + ANSWER_ROOM


def refusal(agent: Agent, model: ServedModel, manifest: Path | None) -> str | None:
    """Why ``model`` is too small for ``agent`` and what to change, or ``None`` when it fits.
    ``manifest``: the file that defines the model, where it was found."""
    need = needed_context(agent)
    if need is None or model.context >= need:
        return None
    advised = math.ceil(need / CONTEXT_STEP) * CONTEXT_STEP
    head = (f"{model.id} has a context of {model.context:,} tokens; {agent.name}'s first "
            f"prompt alone is about {agent.first_prompt:,} tokens")
    if model.trained is not None and model.trained < need:
        return (f"{head}, and its GGUF was trained for {model.trained:,}: choose a model "
                "with a longer context")
    where = str(manifest) if manifest else f"the manifest with id: {model.id}"
    trained = f"; the model was trained for {model.trained:,}" if model.trained else ""
    if model.source == "manifest":
        how = (f"raise ctx_size in {where} to {advised} or more (llama.cpp divides it among "
               f"the parallel slots{trained})")
    else:
        how = (f"give it a manifest with ctx_size: {advised} (a {model.source} model is "
               f"served with the settings' default_ctx_size{trained})")
    return f"{head}: {how}"


def find_manifest(model_id: str, folders: Iterable[Path]) -> Path | None:
    """The YAML file in ``folders`` whose ``id`` is ``model_id``, if one is there."""
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
            try:
                data = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(data, dict) and data.get("id") == model_id:
                return path
    return None
