"""The bodies of Ollama's API, as pydantic models: what Ollama clients send to ``/api/chat``,
``/api/generate``, ``/api/embed``, ``/api/embeddings`` and ``/api/show``.

Fields Ollama defines and model-boss reads are typed; unknown fields are ignored, as Ollama
ignores them. model-boss's own ``x_*`` fields ride in the body as on the OpenAI routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictBool

from ..extensions import ExtensionFields, Int, Number


def _keep_alive(value: Any) -> Any:
    if value is None or isinstance(value, str) or (
            isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise ValueError("must be a duration such as \"5m\", a number of seconds, 0 or -1")


def _format(value: Any) -> Any:
    if value is None or value in ("", "json") or isinstance(value, dict):
        return value
    raise ValueError("must be \"json\" or a JSON schema object")


def _stop(value: Any) -> Any:
    if value is None or isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return value
    raise ValueError("must be a string or an array of strings")


KeepAlive = Annotated[Any, PlainValidator(_keep_alive,
                                          json_schema_input_type=str | float | None)]
Format = Annotated[Any, PlainValidator(_format,
                                       json_schema_input_type=str | dict[str, Any] | None)]
Stop = Annotated[Any, PlainValidator(_stop, json_schema_input_type=str | list[str] | None)]


class OllamaOptions(BaseModel):
    """``options``: sampling options go to the worker with each request; load-time options
    (``num_gpu``, ``num_thread``, ``use_mmap``, ...) are the manifest's to set and are
    ignored here, as Ollama ignores options it does not know. ``num_ctx`` is checked
    against the manifest's context."""

    model_config = ConfigDict(extra="allow")

    num_predict: Int | None = Field(default=None, ge=-2)
    num_ctx: Int | None = Field(default=None, ge=1)
    temperature: Number | None = Field(default=None, ge=0)
    top_k: Int | None = Field(default=None, ge=0)
    top_p: Number | None = Field(default=None, ge=0, le=1)
    min_p: Number | None = Field(default=None, ge=0, le=1)
    typical_p: Number | None = Field(default=None, ge=0, le=1)
    repeat_penalty: Number | None = Field(default=None, ge=0)
    repeat_last_n: Int | None = Field(default=None, ge=-1)
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    seed: Int | None = None
    stop: Stop = None
    num_keep: Int | None = Field(default=None, ge=-1)
    mirostat: Int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: Number | None = None
    mirostat_eta: Number | None = None


class _OllamaRequest(ExtensionFields):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="a model id or alias (an Ollama tag such as "
                       "'smollm2:135m'; ':latest' may be added or left out), or 'task:<name>'")
    keep_alive: KeepAlive = None
    options: OllamaOptions | None = None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    function: ToolCallFunction


class OllamaMessage(BaseModel):
    """One chat message; ``images`` are base64 strings (the client encodes files)."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class _Generation(_OllamaRequest):
    stream: StrictBool = True  # Ollama streams unless told not to
    format: Format = None
    think: StrictBool | str | None = None


class OllamaChatRequest(_Generation):
    """``POST /api/chat``. No messages: load the model (or unload it with keep_alive 0)."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class OllamaGenerateRequest(_Generation):
    """``POST /api/generate``. An empty prompt loads the model (or unloads it with
    keep_alive 0). ``raw`` sends the prompt as it is, without the chat template."""

    prompt: str | None = ""
    system: str | None = None
    images: list[str] | None = None
    raw: StrictBool = False
    suffix: str | None = None
    template: str | None = None
    context: list[Int] | None = None


class OllamaEmbedRequest(_OllamaRequest):
    """``POST /api/embed``."""

    input: str | list[str] = Field(min_length=1)
    truncate: StrictBool | None = None
    dimensions: Int | None = Field(default=None, ge=1)


class OllamaEmbeddingsRequest(_OllamaRequest):
    """``POST /api/embeddings`` (Ollama's older embedding route)."""

    prompt: str = Field(min_length=1)


class OllamaShowRequest(BaseModel):
    """``POST /api/show``; older clients send ``name`` instead of ``model``."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, min_length=1)
    verbose: StrictBool | None = None

    @property
    def wanted(self) -> str | None:
        return self.model or self.name


class OllamaPullRequest(OllamaShowRequest):
    """``POST /api/pull``: ``hf.co/ORG/REPO:QUANT`` (Ollama's spelling of a hub GGUF)."""

    insecure: StrictBool | None = None
    stream: StrictBool = True


class OllamaDeleteRequest(OllamaShowRequest):
    """``DELETE /api/delete``."""
