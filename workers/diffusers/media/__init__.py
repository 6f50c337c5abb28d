"""What the worker reads and writes of media: a picture sent as text (:mod:`.pictures`, by
the rule :mod:`workers.pictures` declares for the coordinator too) and a clip encoded as MP4
(:mod:`.mp4`)."""

from __future__ import annotations

from .mp4 import encode_mp4, video_codec
from .pictures import decode_picture

__all__ = ["decode_picture", "encode_mp4", "video_codec"]
