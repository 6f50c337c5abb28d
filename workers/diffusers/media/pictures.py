"""The one way a picture sent as text reaches a pipeline: an edit's picture and mask, an
IP-Adapter reference, a video's starting frame. Base64 (whitespace and line breaks allowed) or
a ``data:`` URL; PNG, JPEG or WebP; read whole before any work (a truncated file fails here,
not mid-generation); past PIL's decompression-bomb limit refused. Anything else is a 400
naming the field."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from ..errors import InvalidRequest

FORMATS = ("PNG", "JPEG", "WEBP")  # PIL reads which from the bytes


def decode_picture(data: str, param: str, mode: str = "RGB") -> Any:
    """``data`` as a PIL image in ``mode``; ``InvalidRequest`` naming ``param`` otherwise."""
    from PIL import Image

    raw = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        blob = base64.b64decode("".join(raw.split()), validate=True)
        with Image.open(io.BytesIO(blob), formats=FORMATS) as image:
            image.load()
            return image.convert(mode)
    except (binascii.Error, ValueError, OSError, Image.DecompressionBombError) as exc:
        reason = "not base64" if isinstance(exc, binascii.Error) else \
            f"not a PNG, JPEG or WebP image ({type(exc).__name__})"
        raise InvalidRequest(f"{param}: not a picture (send a base64 PNG, JPEG or WebP): "
                             f"{reason}", param=param) from None
