"""The bodies the serving service accepts, as pydantic models (the OpenAPI document's source).

Fields OpenAI defines and model-boss reads are typed; every other field is kept
(``extra="allow"``) and passed to the worker untouched, as OpenAI-compatible servers accept
fields of their own (``top_k``, ``min_p``, ``grammar``, ...).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    field_validator,
    model_validator,
)

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


def _one_of(what: str, check: Any, kinds: Any) -> Any:
    """A field of several JSON shapes, one message when it fits none (a union would name
    each member's failure in the field's path)."""
    def validate(value: Any) -> Any:
        if not check(value):
            raise ValueError(f"must be {what}")
        return value

    return PlainValidator(validate, json_schema_input_type=kinds)


NonEmptyInput = Annotated[Any, _text_or_array("a non-empty string or array")]
Stop = Annotated[Any, _one_of(
    "a string, an array of strings or null",
    lambda v: v is None or isinstance(v, str)
    or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
    str | list[str] | None)]
ToolChoice = Annotated[Any, _one_of(
    "'none', 'auto', 'required' or an object naming a function",
    lambda v: v is None or v in ("none", "auto", "required") or isinstance(v, dict),
    Literal["none", "auto", "required"] | dict[str, Any] | None)]
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

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content = None


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` asks for a last chunk carrying the usage."""

    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool | None = None


class _Sampling(OpenAIRequest):
    max_tokens: Int | None = Field(default=None, ge=1)
    n: Int | None = Field(default=None, ge=1, le=128,
                          description="choices; at most what the model serves (llama: 1)")
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, ge=0, le=1)
    presence_penalty: Number | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: Number | None = Field(default=None, ge=-2, le=2)
    seed: Int | None = None
    stop: Stop = None
    logit_bias: dict[str, Annotated[Number, Field(ge=-100, le=100)]] | None = Field(
        default=None, description="token id (or, on llama.cpp, text) → bias, -100 to 100")
    stream_options: StreamOptions | None = None


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the output must follow."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=64)
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _schema_is_an_object(self) -> JsonSchemaFormat:
        # kept as an extra field: a field named "schema" would shadow BaseModel.schema
        if not isinstance((self.model_extra or {}).get("schema", {}), dict):
            raise ValueError("'schema' must be a JSON object")
        return self


class ResponseFormat(BaseModel):
    """``response_format``: free text, any JSON object, or JSON following a schema."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        return self


class FunctionSpec(BaseModel):
    """A function a model may call."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(BaseModel):
    """``tools[]``: a function tool."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: FunctionSpec


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: dict[str, Any] | None = None
    max_completion_tokens: Int | None = Field(default=None, ge=1,
                                              description="limits the output, as max_tokens")
    logprobs: StrictBool | None = None
    top_logprobs: Int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: StrictBool | None = None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: NonEmptyInput
    logprobs: Int | None = Field(default=None, ge=0, le=20)
    echo: StrictBool | None = None


class ResponsesRequest(OpenAIRequest):
    """``POST /v1/responses`` (the OpenAI Responses API, spoken by llama.cpp's server)."""

    input: NonEmptyInput
    instructions: str | None = None
    max_output_tokens: Int | None = Field(default=None, ge=1)
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, ge=0, le=1)


class EmbeddingRequest(OpenAIRequest):
    """``POST /v1/embeddings``."""

    input: NonEmptyInput
    dimensions: Int | None = Field(default=None, ge=1)
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str = Field(min_length=1)


class RerankRequest(OpenAIRequest):
    """``POST /v1/rerank``: the shape llama.cpp's server, Jina and Cohere clients send."""

    query: str = Field(min_length=1, max_length=100_000)
    documents: list[Annotated[str, Field(min_length=1)] | RerankDocument] = Field(
        min_length=1, max_length=4096)
    top_n: Int | None = Field(default=None, ge=1)
    return_documents: StrictBool | None = None


class SpeechRequest(OpenAIRequest):
    """``POST /v1/audio/speech``: passed to a TTS worker."""

    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = None
    speed: Number | None = Field(default=None, ge=0.25, le=4.0)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] | None = None
    voices: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1, max_length=4,
        description="a voice-cloning model's (VibeVoice): one reference voice per speaker "
                    "of a script ('Speaker 1: ...' lines), in order; 'voice' is then not read")
    seed: Int | None = Field(default=None, ge=0, le=2**63 - 1,
                             description="the same seed, input and voices give the same audio")


class TranscriptionRequest(OpenAIRequest):
    """The form fields of ``POST /v1/audio/transcriptions`` and ``/translations`` besides
    ``file`` (which reaches the worker as base64 in ``file``)."""

    language: str | None = Field(default=None, min_length=2, max_length=16)
    prompt: str | None = Field(default=None, max_length=4096)
    temperature: Number | None = Field(default=None, ge=0, le=1)
    response_format: Literal["json", "text", "srt", "vtt", "verbose_json"] | None = None
    timestamp_granularities: list[Literal["word", "segment"]] | None = None


# pictures sent as text: base64, or a data: URL (services/media/pictures.py decodes them)
Picture = Annotated[str, Field(min_length=1)]
_REFERENCE = "pictures whose identity or style steer the result (a model with an IP-Adapter)"


class _Pictured(OpenAIRequest):
    """What every request that makes pictures or clips shares: its prompt and size."""

    prompt: str = Field(min_length=1, max_length=32000)
    size: str | None = Field(default=None, pattern=_SIZE.pattern,
                             description=f"'WxH', multiples of 8 from 64 to {MAX_SIDE}")

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, prompt: str) -> str:
        if not prompt.strip():
            raise ValueError("must not be blank")
        return prompt

    @field_validator("size", mode="before")
    @classmethod
    def _sides(cls, size: Any) -> Any:
        match = _SIZE.match(size) if isinstance(size, str) else None
        if match:
            width, height = int(match.group(1)), int(match.group(2))
            if not (64 <= width <= MAX_SIDE and 64 <= height <= MAX_SIDE) or width % 8 \
                    or height % 8:
                raise ValueError(f"sides must be multiples of 8 between 64 and {MAX_SIDE}")
        return None if size == "auto" else size


class ImageRequest(_Pictured):
    """``POST /v1/images/generations``, plus the diffusers extensions."""

    n: Int | None = Field(default=None, ge=1, le=10)
    response_format: Literal["b64_json", "url"] | None = None
    x_steps: Int | None = Field(default=None, ge=1, le=200)
    x_seed: Int | None = Field(default=None, ge=0, le=2**63 - 1)
    x_guidance: Number | None = Field(default=None, ge=0, le=50)
    x_negative_prompt: str | None = None
    reference_images: list[Picture] | None = Field(default=None, min_length=1, max_length=4,
                                                   description=_REFERENCE)
    reference_strength: Number | None = Field(default=None, ge=0, le=1)

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


class EditRequest(_Pictured):
    """``POST /v1/images/edits`` (OpenAI's form; a job's body as JSON): the first of
    ``image`` edited, inpainted where ``mask`` is transparent; ``strength``, ``steps``,
    ``seed``, ``guidance``, ``negative_prompt`` and references as extensions."""

    image: Picture | list[Picture] = Field(description="the picture to edit")
    mask: Picture | None = Field(default=None, description="transparent pixels are repainted")
    n: Int | None = Field(default=None, ge=1, le=10)
    response_format: Literal["b64_json", "url"] | None = None
    strength: Number | None = Field(default=None, gt=0, le=1,
                                    description="how far from the picture (0.75)")
    steps: Int | None = Field(default=None, ge=1, le=200)
    seed: Int | None = Field(default=None, ge=0, le=2**63 - 1)
    guidance: Number | None = Field(default=None, ge=0, le=50)
    negative_prompt: str | None = None
    reference_images: list[Picture] | None = Field(default=None, min_length=1, max_length=4,
                                                   description=_REFERENCE)
    reference_strength: Number | None = Field(default=None, ge=0, le=1)

    @field_validator("image")
    @classmethod
    def _one_or_more(cls, image: str | list[str]) -> str | list[str]:
        if isinstance(image, list) and not image:
            raise ValueError("send the picture to edit")
        return image


class VideoRequest(_Pictured):
    """``POST /v1/videos`` (OpenAI's form; JSON too): a clip of ``seconds`` from the prompt
    (and ``input_reference``, for an image-to-video model); ``steps``, ``fps``, ``seed``,
    ``guidance`` and ``negative_prompt`` as extensions."""

    seconds: Number | None = Field(default=None, gt=0, le=600)
    input_reference: Picture | None = None
    fps: Int | None = Field(default=None, ge=1, le=60)
    steps: Int | None = Field(default=None, ge=1, le=200)
    seed: Int | None = Field(default=None, ge=0, le=2**63 - 1)
    guidance: Number | None = Field(default=None, ge=0, le=50)
    negative_prompt: str | None = None


ENDPOINT_BODIES: dict[str, type[OpenAIRequest]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/rerank": RerankRequest,
    "/v1/audio/speech": SpeechRequest,
    "/v1/images/generations": ImageRequest,
    "/v1/images/edits": EditRequest,
    "/v1/videos": VideoRequest,
}
