"""A picture sent as text, read one way everywhere: by the coordinator before any model is
loaded for it (edits, IP-Adapter references, a video's first frame) and by the diffusers
worker that receives it. Base64, line breaks allowed, or a ``data:`` URL; PNG, JPEG or WebP;
at most ``max_side`` pixels a side where a bound is given; read whole before any work (a
truncated file fails here, not mid-generation); past PIL's decompression-bomb limit refused.
A bad one is a :class:`PictureError` saying why; each side words it in its own error."""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any

FORMATS = ("PNG", "JPEG", "WEBP")  # PIL reads which from the bytes
# data:image/png;base64,... as browsers and A1111 clients send pictures in JSON
DATA_URL = re.compile(r"^data:[\w.+-]+/[\w.+-]+(?:;[\w=.+-]+)*;base64,", re.ASCII)


class PictureError(ValueError):
    """Why a picture cannot be read. ``text``: the text is no picture's base64; otherwise the
    bytes are no PNG, JPEG or WebP, too big, or not whole (the cause is PIL's error)."""

    def __init__(self, reason: str, *, text: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.text = text


def picture_bytes(value: Any) -> bytes:
    """A picture sent as text (base64, or a ``data:`` URL) as its bytes."""
    if not isinstance(value, str) or not value:
        raise PictureError("must be a picture as base64 (or a data: URL)", text=True)
    try:
        return base64.b64decode("".join(DATA_URL.sub("", value.strip(), count=1).split()),
                                validate=True)
    except (binascii.Error, ValueError):
        raise PictureError("is not valid base64", text=True) from None


def open_picture(data: bytes, max_side: int | None = None) -> Any:
    """``data`` decoded whole as a PNG, JPEG or WebP (a PIL image)."""
    from PIL import Image, UnidentifiedImageError

    try:
        picture = Image.open(io.BytesIO(data), formats=FORMATS)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise PictureError("is not a picture (send a PNG, JPEG or WebP)") from exc
    width, height = picture.size
    if max_side is not None and (width > max_side or height > max_side):
        raise PictureError(f"is {width}x{height}; this server takes pictures up to "
                           f"{max_side} pixels a side (max_image_side)")
    try:
        picture.load()
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise PictureError("is not a whole picture (it could not be decoded)") from exc
    return picture
