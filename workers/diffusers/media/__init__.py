"""What a pipeline makes and how it is handed out: ``kinds`` tells an image pipeline from a
video one by its class name and holds a video pipeline's frame and size rules; ``mp4``
encodes frames. Plain functions that import nothing of the worker, so the loader and the
video path both use them without an import circle."""

from __future__ import annotations

from ...pipeline_kinds import (
    PipelineKind,
    frames_for,
    is_video_pipeline,
    off_multiple,
    pipeline_kind,
    takes_image,
)
from .mp4 import encode_mp4, video_codec

__all__ = [
    "PipelineKind",
    "encode_mp4",
    "frames_for",
    "is_video_pipeline",
    "off_multiple",
    "pipeline_kind",
    "takes_image",
    "video_codec",
]
