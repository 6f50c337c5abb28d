"""What a diffusers pipeline makes, told from its class name (``_class_name`` in
model_index.json), and the frame and size rules a video pipeline imposes. Pure functions over
names and numbers, importing nothing: the worker's loader tags a pipeline with its kind, the
coordinator's catalog tells a video model from a picture one before it loads, and the tests
check every rule by table without building a model."""

from __future__ import annotations

from enum import StrEnum


class PipelineKind(StrEnum):
    """Which route serves a pipeline: ``POST /generate`` (images) or ``POST /video``."""

    IMAGE = "image"
    VIDEO = "video"


# diffusers' video families whose class names do not all say "Video" (LTXPipeline, WanPipeline)
VIDEO_PREFIXES = ("Wan", "LTX", "CogVideoX", "HunyuanVideo", "Mochi", "Allegro", "Latte",
                  "TextToVideoSD", "VideoToVideoSD", "AnimateDiff", "I2VGenXL",
                  "StableVideoDiffusion", "SkyReels", "EasyAnimate", "Helios", "PIA",
                  "LucyEdit", "ChronoEdit", "AnyFlow", "SanaWM")
VIDEO_MARKS = ("Video", "I2V", "T2V", "ToWorld")  # Kandinsky5T2V, CosmosTextToWorld, ...
# image-to-video pipelines: the input image is the video's first frame (or its reference)
IMAGE_INPUT_MARKS = ("ImageToVideo", "Image2Video", "I2V", "StableVideoDiffusion")
IMAGE_INPUT_PREFIXES = ("PIA",)


def is_video_pipeline(class_name: str) -> bool:
    """Whether the pipeline class named ``class_name`` makes videos (``.frames``)."""
    return class_name.startswith(VIDEO_PREFIXES) or any(m in class_name for m in VIDEO_MARKS)


def takes_image(class_name: str) -> bool:
    """Whether the pipeline class named ``class_name`` needs an input image (image-to-video;
    a text-or-image "TI2V" one only may take one)."""
    if "TI2V" in class_name:
        return False
    return (any(m in class_name for m in IMAGE_INPUT_MARKS)
            or class_name.startswith(IMAGE_INPUT_PREFIXES))


def pipeline_kind(class_name: str) -> PipelineKind:
    """``VIDEO`` for a video pipeline, else ``IMAGE``."""
    return PipelineKind.VIDEO if is_video_pipeline(class_name) else PipelineKind.IMAGE


def frames_for(asked: int, temporal_ratio: int) -> int:
    """The fewest frames at or above ``asked`` that a VAE compressing time by
    ``temporal_ratio`` makes whole: ``k * ratio + 1`` (Wan 4k+1, LTX 8k+1, Mochi 6k+1). A
    ratio of 1 (AnimateDiff, TextToVideoSD: no temporal compression) takes any count. Rounded
    up, not down as the pipelines do, so a video is never shorter than asked."""
    if temporal_ratio <= 1:
        return asked
    return -(-(asked - 1) // temporal_ratio) * temporal_ratio + 1


def off_multiple(width: int, height: int, multiple: int) -> str | None:
    """``"width"`` or ``"height"`` when it is not a multiple of ``multiple`` (the VAE's spatial
    compression times the transformer's patch: Wan 16), else None. Refused rather than
    rounded: the pipelines round down with only a log line."""
    for name, value in (("width", width), ("height", height)):
        if value % multiple:
            return name
    return None
