"""Edits: image-to-image and inpainting on the loaded text-to-image pipeline.

The edit pipelines are made from the loaded pipeline's own components with diffusers'
``from_pipe`` (``AutoPipelineForImage2Image`` / ``AutoPipelineForInpainting`` pick the class
that matches the family: Stable Diffusion, SDXL, SD3, FLUX, ...): the UNet or transformer,
the VAE and the text encoders are the same objects, so an edit loads nothing and puts no new
weights in VRAM, and the weights move with the pipeline to and from the CPU tier. Each is
made once, at the first edit of its kind, and kept.

The coordinator has checked the pictures (decodable, sizes, a mask with something to
repaint) and sends them as PNGs: the image in RGB, the mask as diffusers reads one (white is
repainted, black kept)."""

from __future__ import annotations

import inspect
import math
import threading
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest
from .media.pictures import decode_picture


@dataclass(frozen=True, slots=True)
class EditPipeline:
    """A pipeline made from the loaded one, and the arguments its ``__call__`` takes."""

    pipe: Any
    call_params: frozenset[str]


class EditPipelines:
    """The edit pipelines of one loaded pipeline, made at their first use."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, str], EditPipeline] = {}
        self._lock = threading.Lock()

    def get(self, base: Any, inpaint: bool) -> EditPipeline:
        """The image-to-image (or, with ``inpaint``, inpainting) pipeline sharing ``base``'s
        components; a 400 naming the pipeline when diffusers has no such variant of it."""
        kind = "inpaint" if inpaint else "img2img"
        key = (id(base), kind)
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = _derive(base, inpaint)
            return made


def _derive(base: Any, inpaint: bool) -> EditPipeline:
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    maker = AutoPipelineForInpainting if inpaint else AutoPipelineForImage2Image
    try:
        pipe = maker.from_pipe(base)
    except (ValueError, KeyError, TypeError) as exc:
        what = "inpainting" if inpaint else "image-to-image"
        raise InvalidRequest(f"this model's pipeline ({type(base).__name__}) has no "
                             f"{what} variant in diffusers: {exc}"[:400],
                             param="mask" if inpaint else "image") from None
    pipe.set_progress_bar_config(disable=True)
    return EditPipeline(pipe, frozenset(inspect.signature(pipe.__call__).parameters))


def edit_kwargs(image: str, mask: str | None, strength: float, width: int,
                height: int) -> dict[str, Any]:
    """The edit's own arguments: the picture at the asked size, the mask at the same size
    (nearest neighbour: a mask stays a mask), the strength."""
    from PIL import Image

    picture = decode_picture(image, "image", "RGB")
    if picture.size != (width, height):
        picture = picture.resize((width, height), Image.Resampling.LANCZOS)
    kwargs: dict[str, Any] = {"image": picture, "strength": strength}
    if mask is not None:
        painted = decode_picture(mask, "mask", "L")
        if painted.size != (width, height):
            painted = painted.resize((width, height), Image.Resampling.NEAREST)
        kwargs["mask_image"] = painted
    return kwargs


def edit_steps(steps: int, strength: float) -> int:
    """The steps to ask for so that ``strength`` of them (what an image-to-image pipeline
    runs) is at least one: diffusers refuses a strength that leaves none."""
    return max(steps, math.ceil(1 / strength)) if strength > 0 else steps


def steps_run(steps: int, strength: float) -> int:
    """How many denoising steps an edit at ``strength`` runs (what progress counts to)."""
    return max(1, min(int(steps * strength), steps))
