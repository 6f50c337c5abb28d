"""Frames to an MP4 file in memory, with PyAV: H.264 (``libx264``) where this FFmpeg build has
it, else MPEG-4 part 2, which every build has; yuv420p so browsers and players take it."""

from __future__ import annotations

import functools
import io
from fractions import Fraction
from typing import Any

CODECS = ("libx264", "mpeg4")  # preferred first


@functools.cache
def video_codec() -> str:
    """The first of ``CODECS`` this PyAV build can encode with."""
    import av

    for name in CODECS:
        try:
            av.codec.Codec(name, "w")
        except Exception:  # av's UnknownCodecError, or a decoder-only build
            continue
        return name
    raise RuntimeError(f"this PyAV build encodes none of {', '.join(CODECS)}")


def encode_mp4(frames: Any, fps: int) -> bytes:
    """``frames`` (uint8, frames × height × width × RGB, even sizes) as MP4 bytes at ``fps``.
    No ``faststart``: FFmpeg reopens the file by name to move the index, which a buffer has
    not; the answer carries the whole file anyway."""
    import av

    count, height, width, _ = frames.shape
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as out:
        stream = out.add_stream(video_codec(), rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(count):
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))  # flush the encoder's delayed frames
    return buffer.getvalue()
