"""What a diffusers folder holds, read without loading it: its pipeline's class (from
``model_index.json``), whether that class makes videos, and the IP-Adapter that goes with it.

The class name decides the kind because diffusers names its pipelines by what they make:
``WanPipeline``, ``LTXImageToVideoPipeline``, ``AnimateDiffPipeline``, ... make clips, the
rest (``StableDiffusionPipeline``, ``FluxPipeline``, ...) pictures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.pipeline_kinds import is_video_pipeline
from workers.pipeline_kinds import takes_image as needs_image

from ..endpoints import VIDEOS
from ..errors import BadRequest
from .manifest import BackendKind, Category, ModelManifest

ADAPTER_FOLDERS = ("ip_adapter", "ip-adapter")  # inside a pipeline's folder
DEFAULT_SECONDS = 4.0  # a clip that names no length (OpenAI's default)


def pipeline_class(folder: Path) -> str | None:
    """The ``_class_name`` in ``folder/model_index.json`` (None when unreadable)."""
    try:
        data = json.loads((folder / "model_index.json").read_text())
    except (OSError, ValueError):
        return None
    name = data.get("_class_name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def makes_video(class_name: str | None) -> bool:
    """Whether a pipeline of this class makes clips rather than pictures (the worker's own
    rule, :mod:`workers.pipeline_kinds`, so both sides agree on every class)."""
    return bool(class_name) and is_video_pipeline(class_name)


def takes_image(class_name: str | None) -> bool:
    """Whether a video pipeline of this class starts from a picture (image-to-video)."""
    return bool(class_name) and needs_image(class_name)


def ip_adapter_path(manifest: ModelManifest, folder: Path | None,
                    models_dir: Path) -> Path | None:
    """The IP-Adapter a diffusers model uses: its manifest's ``ip_adapter`` (relative to the
    models folder), else an ``ip_adapter/`` folder inside the pipeline's own; None: none."""
    if manifest.ip_adapter:
        path = Path(manifest.ip_adapter).expanduser()
        return path if path.is_absolute() else models_dir / path
    if folder is None:
        return None
    for name in ADAPTER_FOLDERS:
        if (folder / name).is_dir():
            return folder / name
    return None


def media_refusal(manifest: ModelManifest, folder: Path | None, ip_adapter: Path | None,
                  endpoint: str, body: dict[str, Any]) -> BadRequest | None:
    """Why a diffusers model cannot take this picture or clip request, before it loads: a
    reference for a model with no IP-Adapter, a clip longer than its manifest allows, a
    starting picture for a text-to-video pipeline."""
    if manifest.backend != BackendKind.DIFFUSERS:
        return None
    if body.get("reference_images") and ip_adapter is None:
        return BadRequest(f"'{manifest.id}' has no IP-Adapter, so it cannot take "
                          "reference_images: name one in its manifest (ip_adapter) or put it "
                          "in an ip_adapter/ folder inside the pipeline's folder",
                          param="reference_images", code="references_not_supported")
    if endpoint != VIDEOS or manifest.category != Category.VIDEO:
        return None
    seconds = body.get("seconds") or DEFAULT_SECONDS
    if seconds > manifest.max_video_seconds:
        return BadRequest(f"seconds: '{manifest.id}' makes clips of up to "
                          f"{manifest.max_video_seconds:g} s (its manifest's "
                          f"max_video_seconds); {seconds:g} s asked", param="seconds",
                          code="invalid_value")
    if (body.get("image") or body.get("input_reference")) is not None and folder is not None \
            and not takes_image(pipeline_class(folder)):
        return BadRequest(f"input_reference: '{manifest.id}' makes clips from text only "
                          f"({pipeline_class(folder)}); leave input_reference out or use an "
                          "image-to-video model", param="input_reference",
                          code="invalid_value")
    return None
