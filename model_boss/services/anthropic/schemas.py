"""Anthropic's Messages API bodies as pydantic models (the OpenAPI document's source).

model-boss checks a body itself before any worker sees it: llama.cpp's server answers 200 to
a body without ``max_tokens`` or with ``messages`` as a string. Fields Anthropic defines and
model-boss reads are typed; other fields are kept and passed on (``extra="allow"``), so what a
coding agent adds (``context_management``, ``output_config``, ``cache_control`` on any block,
``service_tier``, betas yet to come) never makes a 400. A ``system`` turn may stand anywhere in
``messages`` (Claude Code's mid-conversation system messages; :mod:`.system_turns` places it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    model_validator,
)

from ..extensions import Int, Number
from ..schemas import OpenAIRequest


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow")


def _as_blocks(what: str):
    """A string stands for one text block (as Anthropic reads it): one shape to validate,
    and one message when the value is neither."""
    def check(value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        if value is None or isinstance(value, list):
            return value
        raise ValueError(f"must be {what}")

    return BeforeValidator(check)


class TextBlock(_Block):
    type: Literal["text"]
    text: StrictStr


class ImageSource(_Block):
    """An image inline (``base64`` with its ``media_type``) or by ``url``."""

    type: Literal["base64", "url"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"] | None = None
    data: StrictStr | None = None
    url: StrictStr | None = None

    @model_validator(mode="after")
    def _complete(self) -> ImageSource:
        if self.type == "base64" and (not self.data or not self.media_type):
            raise ValueError("a base64 image needs 'data' and 'media_type'")
        if self.type == "url" and not self.url:
            raise ValueError("a url image needs 'url'")
        return self


class ImageBlock(_Block):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: StrictStr = Field(min_length=1)
    content: Annotated[list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] | None,
                       _as_blocks("a string or an array of text and image blocks")] = None
    is_error: StrictBool | None = None


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: StrictStr


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
    | RedactedThinkingBlock, Field(discriminator="type")]


class Message(_Block):
    """One turn: ``content`` is a string or a non-empty list of blocks; a ``system`` turn holds
    text only."""

    role: Literal["user", "assistant", "system"]
    content: Annotated[list[ContentBlock], _as_blocks("a string or an array of content blocks"),
                       Field(min_length=1)]

    @model_validator(mode="after")
    def _system_is_text(self) -> Message:
        if self.role == "system" and any(block.type != "text" for block in self.content):
            raise ValueError("a system message holds text blocks only")
        return self


class ToolSpec(_Block):
    """A client tool the model may call (``input_schema`` is its JSON schema), or one of
    Anthropic's server tools (a ``type`` such as ``web_search_20250305``), taken and not
    offered to a local model, which cannot run it (:func:`is_server_tool`)."""

    name: StrictStr = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")
    description: StrictStr | None = None
    input_schema: dict[str, Any] | None = None
    type: StrictStr | None = None

    @model_validator(mode="after")
    def _schema(self) -> ToolSpec:
        if self.type in (None, "custom") and self.input_schema is None:
            raise ValueError("a client tool needs its 'input_schema'")
        return self


def is_server_tool(tool: dict[str, Any]) -> bool:
    """Whether a (validated) tool is one of Anthropic's server tools."""
    return tool.get("type") not in (None, "custom")


class ToolChoice(_Block):
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("type 'tool' needs the tool's 'name'")
        return self


class ThinkingConfig(_Block):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Int | None = Field(default=None, ge=1)


class Metadata(_Block):
    user_id: StrictStr | None = Field(default=None, max_length=256)


class _MessagesBase(OpenAIRequest):
    """What ``/v1/messages`` and its ``count_tokens`` share."""

    model: str | None = Field(  # type: ignore[assignment]
        default=None, min_length=1,
        description="a model id or alias, or 'task:<name>'; a client profile may supply it")
    messages: list[Message] = Field(min_length=1)
    system: Annotated[list[TextBlock] | None,
                      _as_blocks("a string or an array of text blocks")] = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    @model_validator(mode="after")
    def _a_conversation(self) -> _MessagesBase:
        if all(message.role == "system" for message in self.messages):
            raise ValueError("messages: a conversation needs a turn with role 'user' or "
                             "'assistant'; system turns alone are not one")
        return self


class MessagesRequest(_MessagesBase):
    """``POST /v1/messages``."""

    max_tokens: Int = Field(ge=1, description="the most tokens to generate (required)")
    stop_sequences: list[StrictStr] | None = None
    temperature: Number | None = Field(default=None, ge=0, le=1)
    top_p: Number | None = Field(default=None, ge=0, le=1)
    top_k: Int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None


class CountTokensRequest(_MessagesBase):
    """``POST /v1/messages/count_tokens``: the prompt's size, nothing generated."""
