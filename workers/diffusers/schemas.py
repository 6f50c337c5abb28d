"""Request bodies of the worker's HTTP API, validated by pydantic."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# ids the coordinator (or any caller) picks to name a generation, e.g. its own request id
RequestId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
# one reference image, base64 (about 15 MB of image at most)
ReferenceImage = Annotated[str, Field(min_length=1, max_length=20_000_000)]
# a LoRA adapter's name as the worker knows it (an unknown one is refused with the known ones)
AdapterName = Annotated[str, Field(min_length=1, max_length=128)]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _multiple_of_8(value: int) -> int:
    if value % 8:
        raise ValueError("must be a multiple of 8")
    return value


# what a picture's or a clip's request says: a prompt with words in it, sides the VAEs take
Prompt = Annotated[str, Field(min_length=1, max_length=32000), AfterValidator(_not_blank)]
Side = Annotated[int, AfterValidator(_multiple_of_8)]


class GenerateRequest(BaseModel):
    """The body of ``POST /generate``."""

    model_config = ConfigDict(extra="forbid")

    prompt: Prompt
    negative_prompt: str | None = None
    width: Side = Field(default=512, ge=64, le=4096)
    height: Side = Field(default=512, ge=64, le=4096)
    steps: int = Field(default=20, ge=1, le=200)
    guidance: float = Field(default=7.0, ge=0, le=50)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: int = Field(default=1, ge=1, le=10)  # the OpenAI images API allows 1..10
    request_id: RequestId | None = None  # names this generation for POST /cancel
    # an edit (workers/diffusers/edits.py): the picture to start from (base64 PNG, RGB) and,
    # for inpainting, its mask (white is repainted); strength: how far from the picture to go
    image: str | None = Field(default=None, min_length=1)
    mask: str | None = Field(default=None, min_length=1)
    strength: float = Field(default=0.75, gt=0, le=1)
    # identity / style references for a model with an IP-Adapter (workers/diffusers/
    # references.py): base64 PNG, JPEG or WebP images, and how strongly they steer (0: not)
    reference_images: list[ReferenceImage] | None = Field(default=None, max_length=4)
    reference_strength: float = Field(default=0.6, ge=0, le=1)
    # a LoRA adapter the worker loaded (--lora NAME=PATH), on for this generation only, and
    # how strongly (0: the base model's images; workers/diffusers/loras.py)
    adapter: AdapterName | None = None
    adapter_scale: float = Field(default=1.0, ge=0, le=2)

    @model_validator(mode="after")
    def _mask_needs_image(self) -> GenerateRequest:
        if self.mask is not None and self.image is None:
            raise ValueError("mask: a mask needs the image it masks ('image')")
        return self


class CancelRequest(BaseModel):
    """The optional body of ``POST /cancel``: no ``request_id`` cancels every admitted
    generation (what the coordinator's backend sends: it runs one at a time)."""

    model_config = ConfigDict(extra="forbid")

    request_id: RequestId | None = None
