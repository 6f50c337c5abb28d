"""What a pipeline makes and how it is handed out: ``kinds`` tells an image pipeline from a
video one by its class name and holds a video pipeline's frame and size rules; ``mp4``
encodes frames; ``loras`` loads LoRA adapters and puts one on for a request. Plain functions
that import nothing of the worker but its errors, so the loader, the generator and the video
path all use them without an import circle."""

from __future__ import annotations

from ...pipeline_kinds import (
    PipelineKind,
    frames_for,
    is_video_pipeline,
    off_multiple,
    pipeline_kind,
    takes_image,
)
from .loras import applied, attach_loras, lora_file, parse_lora, require_adapter
from .mp4 import encode_mp4, video_codec

__all__ = [
    "PipelineKind",
    "applied",
    "attach_loras",
    "encode_mp4",
    "frames_for",
    "is_video_pipeline",
    "lora_file",
    "off_multiple",
    "parse_lora",
    "pipeline_kind",
    "require_adapter",
    "takes_image",
    "video_codec",
]
