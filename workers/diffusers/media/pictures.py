"""The one way a picture sent as text reaches a pipeline: an edit's picture and mask, an
IP-Adapter reference, a video's starting frame, read by :mod:`workers.pictures` (the rule the
coordinator checks them by too). Anything else is a 400 naming the field."""

from __future__ import annotations

from typing import Any

from ...pictures import PictureError, open_picture, picture_bytes
from ..errors import InvalidRequest


def decode_picture(data: str, param: str, mode: str = "RGB") -> Any:
    """``data`` as a PIL image in ``mode``; ``InvalidRequest`` naming ``param`` otherwise."""
    try:
        picture = open_picture(picture_bytes(data))
    except PictureError as exc:
        reason = "not base64" if exc.text else \
            f"not a PNG, JPEG or WebP image ({type(exc.__cause__).__name__})"
        raise InvalidRequest(f"{param}: not a picture (send a base64 PNG, JPEG or WebP): "
                             f"{reason}", param=param) from None
    with picture:
        return picture.convert(mode)
