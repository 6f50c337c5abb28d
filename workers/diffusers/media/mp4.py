"""Frames to an MP4 file in memory, with PyAV: H.264 (``libx264``) where this FFmpeg build has
it, else MPEG-4 part 2, which every build has; yuv420p so browsers and players take it."""

from __future__ import annotations

import functools
import io
from fractions import Fraction
from typing import Any

CODECS = ("libx264", "mpeg4")  # preferred first
# x264's macroblock-tree rate control read memory it never wrote for some clips (a tiny Wan
# video of 9 frames at 32x32 came out as other bytes on each request of a busy worker, and
# again in a process whose heap held other bytes): off, a seed gives the same file every time,
# for a little more size at the same quality
ENCODER_OPTIONS = {"libx264": {"mbtree": "0"}}


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
        codec = video_codec()
        stream = out.add_stream(codec, rate=Fraction(fps), options=ENCODER_OPTIONS.get(codec))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(count):
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))  # flush the encoder's delayed frames
    return buffer.getvalue()
