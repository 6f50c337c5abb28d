"""Pictures sent in: decoded and checked here, before any model is loaded for them, and
passed to the worker as PNGs in one shape (the picture in RGB, a mask as diffusers reads
one: white is repainted, black kept).

Each bad picture is a 400 naming its field: not a picture, bigger than ``max_image_side`` on
a side, a mask of another size than its image, a mask with nothing to repaint. OpenAI's
edits mark what to repaint by transparency (alpha 0); AUTOMATIC1111's by white pixels."""

from __future__ import annotations

import base64
import io
from typing import Any

from workers import pictures

from ...errors import BadRequest


def _bad(param: str, message: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param, code="invalid_image")


def from_text(value: Any, param: str) -> bytes:
    """A picture sent as text (base64, or a ``data:`` URL) as its bytes
    (:func:`workers.pictures.picture_bytes`, the worker's own rule), or a 400 saying why."""
    try:
        return pictures.picture_bytes(value)
    except pictures.PictureError as exc:
        raise _bad(param, exc.reason) from None


def open_picture(data: bytes, param: str, max_side: int) -> Any:
    """``data`` decoded whole as a PNG, JPEG or WebP of at most ``max_side`` pixels a side (a
    PIL image), or a 400 saying why not."""
    try:
        return pictures.open_picture(data, max_side)
    except pictures.PictureError as exc:
        raise _bad(param, exc.reason) from None


def mask_from_alpha(mask: Any, size: tuple[int, int], param: str = "mask") -> Any:
    """OpenAI's mask: its transparent pixels are repainted. As white-is-repainted (mode L)."""
    _same_size(mask, size, param)
    if "A" not in mask.getbands() and not (mask.mode == "P" and "transparency" in mask.info):
        raise _bad(param, "has no transparency: its fully transparent pixels mark what to "
                          "repaint (a PNG with an alpha channel)")
    alpha = mask.convert("RGBA").getchannel("A")
    repaint = alpha.point(lambda a: 255 if a == 0 else 0)
    if repaint.getextrema()[1] == 0:
        raise _bad(param, "has no fully transparent pixel: nothing to repaint")
    return repaint.convert("L")


def mask_from_white(mask: Any, size: tuple[int, int], param: str = "mask") -> Any:
    """AUTOMATIC1111's mask: its white pixels are repainted (grey scale, as it reads it)."""
    _same_size(mask, size, param)
    grey = mask.convert("L")
    if grey.getextrema()[1] < 128:
        raise _bad(param, "has no white pixel: nothing to repaint")
    return grey.point(lambda v: 255 if v >= 128 else 0)


def _same_size(mask: Any, size: tuple[int, int], param: str) -> None:
    if mask.size != size:
        raise _bad(param, f"is {mask.size[0]}x{mask.size[1]} but the image is "
                          f"{size[0]}x{size[1]}: a mask must be the size of its image")


def png_text(picture: Any, mode: str = "RGB") -> str:
    """``picture`` in ``mode`` as base64 PNG, the worker's one shape."""
    buffer = io.BytesIO()
    picture.convert(mode).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def fitted_size(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """The output size of an edit that names none: its picture's, each side down to a
    multiple of 8 (what the pipelines take), at least 64."""
    width, height = size
    return (min(max_side, max(64, width - width % 8)), min(max_side, max(64, height - height % 8)))
