"""Discovery: every model file under ``models_dir`` is a model, no manifest needed.

A ``*.gguf`` is served by llama.cpp under its file stem, lowercased; the parts of a split model
(``name-00001-of-00003.gguf``) are one model ``name``; a ``mmproj*.gguf`` is the vision
projector of the models beside it, not a model; a folder holding ``model_index.json`` is a
diffusers pipeline. The GGUF header says the rest: the trained context (served as far as the
GPUs hold its KV cache, :mod:`.context`; ``default_ctx_size`` when the header names none)
and, from its pooling type, whether it embeds or reranks.

A folder with a ``config.json`` and its weights, as ``save_pretrained`` (or a hub download)
leaves it, is a transformers model when its files say which kind: a sentence-transformers
folder (``modules.json``) embeds, or reranks when it is a CrossEncoder; a sequence classifier
with one label reranks; Whisper and CTC models (Wav2Vec2, HuBERT) transcribe; VITS models
(MMS-TTS) and VibeVoice speak (a VibeVoice in the voices of the recordings in its ``voices/``
folder, :mod:`.voices`). Other transformers folders (a causal LM, a classifier with several labels)
are not models here. Like a pipeline, a model's folder is not looked into further.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .adapters import adapter_header, attach
from .gguf_header import pooling_of, read_metadata
from .manifest import BackendKind, Category, ModelManifest

log = logging.getLogger(__name__)

MAX_DEPTH = 4  # folders below models_dir that are looked into
SPLIT = re.compile(r"^(?P<name>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})$")
PARTIAL_SUFFIXES = (".partial", ".incomplete", ".part", ".tmp")
# the pulls' record, in models_dir: relative path → where the file came from
PULLS_FILE = ".model-boss-pulls.json"
# architectures llama.cpp runs as encoders: they embed whatever their pooling says
ENCODERS = {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
            "modern-bert", "neo-bert", "t5encoder"}


@dataclass(frozen=True, slots=True)
class FoundModel:
    """One model file (or diffusers folder) under ``models_dir``."""

    id: str
    path: Path  # the file (a split model's first part), or the pipeline's or model's folder
    kind: str  # "gguf" | "diffusers" | "transformers"
    mmproj: Path | None = None
    parts: int = 1
    category: Category | None = None  # a transformers model's kind


WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
           "pytorch_model.bin.index.json")
SPEECH_RECOGNISERS = ("ForCTC", "ForSpeechSeq2Seq", "WhisperForConditionalGeneration")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def transformers_kind(folder: Path, files: list[str]) -> Category | None:
    """What a transformers folder serves, from its files; None when it is not one of the kinds
    the transformers worker runs (or has no weights)."""
    if "config.json" not in files or not any(f in WEIGHTS or (
            f.startswith("model-") and f.endswith(".safetensors")) for f in files):
        return None
    if "modules.json" in files:  # sentence-transformers
        kind = _json(folder / "config_sentence_transformers.json").get("model_type")
        if kind in (None, "SentenceTransformer"):
            return Category.EMBEDDING
        return Category.RERANK if kind == "CrossEncoder" else None  # (sparse: not served)
    config = _json(folder / "config.json")
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    model_type = config.get("model_type")
    if model_type == "whisper" or any(a.endswith(SPEECH_RECOGNISERS) for a in architectures):
        return Category.STT
    if model_type in ("vits", "vibevoice") or any(
            a in ("VitsModel", "VibeVoiceForConditionalGeneration") for a in architectures):
        return Category.TTS
    labels = config.get("id2label") or {}
    if any(a.endswith("ForSequenceClassification") for a in architectures) and (
            config.get("num_labels") == 1 or len(labels) == 1):
        return Category.RERANK
    return None


def _model_folder(folder: Path, files: list[str]) -> bool:
    return "model_index.json" in files or transformers_kind(folder, files) is not None


def _visible(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(PARTIAL_SUFFIXES)


def _walk(root: Path, max_depth: int):
    """(folder, file names) under ``root``, ``max_depth`` folders deep; pipelines (folders
    with model_index.json) are yielded and not entered."""
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as entries:
                items = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue
        files = [e.name for e in items if _visible(e.name) and e.is_file()]
        yield folder, files
        if depth >= max_depth or (depth > 0 and _model_folder(folder, files)):
            continue
        stack.extend((Path(e.path), depth + 1) for e in reversed(items)
                     if _visible(e.name) and e.is_dir())


def scan(models_dir: Path, max_depth: int = MAX_DEPTH) -> list[FoundModel]:
    """Every model under ``models_dir`` (none when it does not exist), in path order. Two
    files with the same stem in different folders: the later one is named ``folder/stem``."""
    found: list[FoundModel] = []
    taken: set[str] = set()

    def name(stem: str, folder: Path) -> str:
        wanted = stem.lower()
        if wanted in taken:
            wanted = (folder.relative_to(models_dir) / stem).as_posix().lower()
        taken.add(wanted)
        return wanted

    if not models_dir.is_dir():
        return found
    for folder, files in _walk(models_dir, max_depth):
        if "model_index.json" in files and folder != models_dir:
            found.append(FoundModel(name(folder.name, folder.parent), folder, "diffusers"))
            continue
        category = transformers_kind(folder, files) if folder != models_dir else None
        if category is not None:
            found.append(FoundModel(name(folder.name, folder.parent), folder, "transformers",
                                    category=category))
            continue
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        projectors = [f for f in ggufs if f.lower().startswith("mmproj")]
        mmproj = folder / projectors[0] if projectors else None
        for file in ggufs:
            if file in projectors:
                continue
            stem = file[:-len(".gguf")]
            split = SPLIT.match(stem)
            if split and int(split["part"]) != 1:
                continue  # llama.cpp finds the other parts from the first
            if split:
                stem = split["name"]
            found.append(FoundModel(name(stem, folder), folder / file, "gguf", mmproj,
                                    int(split["total"]) if split else 1))
    return found


def read_pulls(models_dir: Path) -> dict[str, dict[str, Any]]:
    """The pulls' record (relative path → source, sha256, when); empty when none."""
    try:
        data = json.loads((models_dir / PULLS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(found: FoundModel, default_ctx_size: int, pulled: bool = False) -> ModelManifest:
    """The manifest a discovered model would have had. An unreadable header leaves the model
    listed but unavailable, saying why (``problem``)."""
    source = "pulled" if pulled else "discovered"
    if found.kind == "diffusers":
        return ModelManifest(id=found.id, category=Category.DIFFUSION,
                             backend=BackendKind.DIFFUSERS, path=str(found.path),
                             source=source)
    if found.kind == "transformers":
        return ModelManifest(id=found.id, category=found.category,
                             backend=BackendKind.TRANSFORMERS, path=str(found.path),
                             source=source)
    fields: dict[str, Any] = {"id": found.id, "path": str(found.path), "source": source,
                              "ctx_size": default_ctx_size}
    if found.mmproj is not None:
        fields["mmproj"] = str(found.mmproj)
    try:
        meta = read_metadata(found.path)
    except (OSError, ValueError) as exc:
        return ModelManifest(**fields, problem=f"cannot read the GGUF header: {exc}")
    trained = meta.get(f"{meta.get('general.architecture', '')}.context_length")
    known = isinstance(trained, int) and trained > 0
    if known:
        fields["ctx_size"] = max(64, trained)
    pooling = pooling_of(meta)
    if pooling == "rank":
        fields.update(category=Category.EMBEDDING, reranking=True)
    elif (pooling not in (None, "none")
          or meta.get("general.architecture") in ENCODERS):
        fields.update(category=Category.EMBEDDING, embeddings=True)
    found_model = ModelManifest(**fields)
    found_model.ctx_from = "trained" if known else "default"
    return found_model


def discover(models_dir: Path, default_ctx_size: int) -> list[ModelManifest]:
    """The manifests of every model under ``models_dir``."""
    pulls = read_pulls(models_dir)
    manifests = []
    adapters = []  # LoRA files: served on their bases (catalog/adapters.py), not alone
    for found in scan(models_dir):
        try:
            relative = found.path.relative_to(models_dir).as_posix()
        except ValueError:
            relative = ""
        header = adapter_header(found.path) if found.kind == "gguf" else None
        if header is not None:
            adapters.append((found.id, found.path, header))
            continue
        manifests.append(describe(found, default_ctx_size, pulled=relative in pulls))
    return manifests + attach(manifests, adapters)
