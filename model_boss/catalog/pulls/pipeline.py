"""Which files of a diffusers repository a pull fetches: ``hf://ORG/REPO`` for a repository
with ``model_index.json`` at its top and no GGUF file is fetched as the pipeline folder the
diffusers worker loads, and only that: the files ``DiffusionPipeline.from_pretrained`` reads
with its defaults (no ``variant``), which is how the worker loads it.

The index names the components. A component's folder with weights (unet/, vae/,
text_encoder/, transformer/ ...) gives its ``config.json``, its index of shards and its
full-precision weights, safetensors where it has them, else pickled ``.bin``; its fp16 or
other variants, and copies for other runtimes (ONNX, Flax), are left on the hub. Any other
component's folder (scheduler/, tokenizer/, feature_extractor/) is taken whole. Files outside
the components (README.md, sample pictures, single-file checkpoints at the top) stay on the
hub too.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Any

from ...errors import BadRequest
from .folder import OTHER_SUFFIXES

INDEX = "model_index.json"
# the weights from_pretrained loads when no variant is asked for, shards included
_PLAIN_WEIGHTS = re.compile(r"^(?:diffusion_pytorch_model|pytorch_model|model)"
                            r"(?:-\d{5}-of-\d{5})?\.(?P<format>safetensors|bin)$")
_PLAIN_SHARD_INDEX = re.compile(r"^(?:diffusion_pytorch_model|pytorch_model|model)"
                                r"\.(?P<format>safetensors|bin)\.index\.json$")
# any weights file, a variant's or another runtime's: its folder is a model's
_ANY_WEIGHTS = re.compile(r"\.(?:safetensors|bin|onnx|onnx_data|msgpack|pb|ckpt|pt|pth)$")


class UnservablePipeline(BadRequest):
    """A diffusers repository the worker could not load as it stands on the hub: refused
    before its weights come."""

    status_code = 422
    code = "unsupported_model"


def is_pipeline_repo(files: list[str]) -> bool:
    """A repository to pull as a diffusers pipeline (``model_index.json`` at its top, no
    GGUF file)."""
    return INDEX in files and not any(f.lower().endswith(".gguf") for f in files)


def read_index(raw: bytes, repo: str) -> dict[str, Any]:
    """The pipeline's ``model_index.json``; a 422 when it is not one."""
    try:
        index = json.loads(raw)
    except ValueError:
        index = None
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise UnservablePipeline(f"{repo}'s {INDEX} names no pipeline class (no "
                                 "\"_class_name\"): not a diffusers pipeline",
                                 param="source")
    return index


def components(index: dict[str, Any]) -> list[str]:
    """The components the index names with a library and a class (``[null, null]`` is one
    the pipeline goes without, such as a removed safety checker)."""
    return [name for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and len(value) == 2
            and all(isinstance(part, str) for part in value)]


def choose_pipeline_files(files: list[str], index: dict[str, Any], repo: str) -> list[str]:
    """The repository's files the worker loads, in the repository's order."""
    kept = {INDEX}
    for component in components(index):
        inside = [f for f in files if f.startswith(f"{component}/")]
        if any(_ANY_WEIGHTS.search(f) for f in inside):
            kept.update(_weights(component, inside, repo))
        else:  # a scheduler's, a tokenizer's: all of it but hidden files
            kept.update(f for f in inside if not PurePosixPath(f).name.startswith(".")
                        and not f.lower().endswith(OTHER_SUFFIXES))
    return [f for f in files if f in kept]


def _weights(component: str, inside: list[str], repo: str) -> list[str]:
    """A model component's config and one format of its full-precision weights."""
    def leaf(name: str) -> str:
        return PurePosixPath(name).name

    formats = {m["format"] for f in inside
               if f.count("/") == 1 and (m := _PLAIN_WEIGHTS.match(leaf(f)))}
    if not formats:
        theirs = ", ".join(leaf(f) for f in inside if _ANY_WEIGHTS.search(f))
        raise UnservablePipeline(
            f"{repo}'s {component}/ has no weights diffusers loads without a variant (it "
            f"has {theirs}); the worker loads a pipeline as save_pretrained writes it, "
            "without a variant", param="source")
    chosen = "safetensors" if "safetensors" in formats else "bin"
    return [f for f in inside if f.count("/") == 1 and (
            leaf(f) == "config.json"
            or ((m := _PLAIN_WEIGHTS.match(leaf(f)) or _PLAIN_SHARD_INDEX.match(leaf(f)))
                and m["format"] == chosen))]
