"""The bodies the serving service accepts, as pydantic models (the OpenAPI document's source).

Fields OpenAI defines and model-boss reads are typed; every other field is kept
(``extra="allow"``) and passed to the worker untouched, as OpenAI-compatible servers accept
fields of their own (``top_k``, ``min_p``, ``grammar``, ...).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictBool, field_validator

from .extensions import ExtensionFields, Int, Number

MAX_SIDE = 4096
_SIZE = re.compile(r"^(\d{2,4})x(\d{2,4})$")


def _text_or_array(what: str, *, allow_none: bool = False, non_empty: bool = True):
    def check(value: Any) -> Any:
        if value is None and allow_none:
            return value
        if not isinstance(value, (str, list)) or (non_empty and len(value) == 0):
            raise ValueError(f"must be {what}")
        return value

    kinds = str | list[Any] | None if allow_none else str | list[Any]
    return PlainValidator(check, json_schema_input_type=kinds)


NonEmptyInput = Annotated[Any, _text_or_array("a non-empty string or array")]
Content = Annotated[Any, _text_or_array("a string, an array of parts or null",
                                        allow_none=True, non_empty=False)]


class OpenAIRequest(ExtensionFields):
    """What every OpenAI-style body may carry; unknown fields go to the worker."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(
        default=None, min_length=1,
        description="a model id or alias, or 'task:<name>'; a client profile may supply it")
    stream: StrictBool | None = None


class ChatMessage(BaseModel):
    """One message; tool calls, names and other OpenAI fields pass through."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: Content = None


class _Sampling(OpenAIRequest):
    max_tokens: Int | None = Field(default=None, ge=1)
    n: Int | None = Field(default=None, ge=1, le=128,
                          description="choices; at most what the model serves (llama: 1)")
    temperature: Number | None = Field(default=None, ge=0, le=2)


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: NonEmptyInput


class EmbeddingRequest(OpenAIRequest):
    """``POST /v1/embeddings``."""

    input: NonEmptyInput


class SpeechRequest(OpenAIRequest):
    """``POST /v1/audio/speech``: passed to a TTS worker."""

    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = None


class ImageRequest(OpenAIRequest):
    """``POST /v1/images/generations``, plus the diffusers extensions."""

    prompt: str = Field(min_length=1, max_length=32000)
    n: Int | None = Field(default=None, ge=1, le=10)
    size: str | None = Field(default=None, pattern=_SIZE.pattern,
                             description=f"'WxH', multiples of 8 from 64 to {MAX_SIDE}")
    response_format: Literal["b64_json", "url"] | None = None
    x_steps: Int | None = Field(default=None, ge=1, le=200)
    x_seed: Int | None = Field(default=None, ge=0, le=2**63 - 1)
    x_guidance: Number | None = Field(default=None, ge=0, le=50)
    x_negative_prompt: str | None = None

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, prompt: str) -> str:
        if not prompt.strip():
            raise ValueError("must not be blank")
        return prompt

    @field_validator("size")
    @classmethod
    def _sides(cls, size: str | None) -> str | None:
        match = _SIZE.match(size) if size else None
        if match:
            width, height = int(match.group(1)), int(match.group(2))
            if not (64 <= width <= MAX_SIDE and 64 <= height <= MAX_SIDE) or width % 8 \
                    or height % 8:
                raise ValueError(f"sides must be multiples of 8 between 64 and {MAX_SIDE}")
        return size

    def worker_body(self) -> dict[str, Any]:
        """The request in the diffusers worker's terms."""
        width, height = (int(side) for side in (self.size or "512x512").split("x"))
        body: dict[str, Any] = {"prompt": self.prompt, "n": self.n or 1, "width": width,
                                "height": height}
        if self.model is not None:
            body["model"] = self.model
        for name, value in (("steps", self.x_steps), ("seed", self.x_seed),
                            ("guidance", self.x_guidance),
                            ("negative_prompt", self.x_negative_prompt)):
            if value is not None:
                body[name] = value
        return body


ENDPOINT_BODIES: dict[str, type[OpenAIRequest]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/audio/speech": SpeechRequest,
    "/v1/images/generations": ImageRequest,
}
