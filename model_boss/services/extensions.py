"""The ``x_*`` request extensions (and their headers): documented, validated, stripped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, BeforeValidator, Field, StrictBool

from ..cluster import FORWARDED_HEADER
from ..tenancy.keys import Identity
from .validation import parse


def _a_number(value: Any) -> Any:
    # a JSON number, as OpenAI and Anthropic take one: "10" and true are refused by name
    if isinstance(value, bool) or isinstance(value, str):
        raise ValueError(f"must be a number, not {orjson.dumps(value).decode()}")
    return value


# JSON numbers, never strings or booleans; integers fit in 64 bits, as every worker reads them
Int = Annotated[int, BeforeValidator(_a_number), Field(ge=-(2**63), le=2**63 - 1)]
Number = Annotated[float, BeforeValidator(_a_number)]


class ExtensionFields(BaseModel):
    """model-boss's own request fields; removed before the body goes to a worker."""

    x_client_id: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="who is asking (client profiles, fair share); also the X-Client-Id header")
    x_priority: Int | None = Field(
        default=None, ge=0, le=100,
        description="lower is more important; also the X-Priority header")
    x_budget_s: Number | None = Field(
        default=None, ge=0.001, le=86400,
        description="answer 503 at once when the predicted wait + load + run is longer")
    x_keep_alive_s: Number | None = Field(
        default=None, ge=-1, le=30 * 86400,
        description="how long the model stays loaded after this request (0: unload, -1: keep)")
    x_task: str | None = Field(default=None, min_length=1, description="a task from tasks.yaml")
    x_thinking: StrictBool | None = Field(
        default=None, description="turn a model's thinking on or off")
    x_session_id: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="keeps a conversation on one replica; also the X-Session-Id header")


# a member's forward carries the key it let the request in with (trusted only on a forward)
CARRIED_IDENTITY = ("x_key", "x_end_user")
_HEADERS = {"x_client_id": "x-client-id", "x_priority": "x-priority",
            "x_session_id": "x-session-id"}
_NUMERIC = {"x_priority"}


@dataclass(slots=True)
class Extensions:
    """The extensions of one request, parsed; ``extra`` keeps the other ``x_*`` fields."""

    client_id: str | None = None
    priority: int | None = None
    budget_s: float | None = None
    keep_alive_s: float | None = None
    task: str | None = None
    thinking: bool | None = None
    session_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    forwarded: bool = False  # sent on by a cluster member (secret checked): served here
    request_id: str | None = None  # the queue's id for it (a job's id); set here, not by clients
    # who the edge says it is (:func:`~model_boss.tenancy.keys.identity_of`); None: not asked
    identity: Identity | None = None


def _header_value(name: str, value: str) -> Any:
    """A header's text as the field's type (a number where the field is one)."""
    if name in _NUMERIC:
        try:
            return int(value.strip())
        except ValueError:
            return value
    return value


def pop_extensions(body: dict[str, Any], headers: Mapping[str, str],
                   identity: Identity | None) -> Extensions:
    """Remove every ``x_*`` key from ``body`` and return them parsed, for a request the edge
    identified as ``identity``; the ``X-Client-Id`` / ``X-Priority`` headers fill in what the
    body does not say (under a key, ``X-Client-Id`` is the identity's end user, not a client)."""
    found = {key: body.pop(key) for key in [k for k in body if k.startswith("x_")]}
    forwarded = FORWARDED_HEADER in headers
    carried = {name: found.pop(name, None) for name in CARRIED_IDENTITY}
    if forwarded and (identity is None or not identity.keyed) \
            and isinstance(carried["x_key"], str):
        # a member's forward (its secret checked at the edge): the key it was let in with
        identity = Identity(carried["x_key"], end_user=carried["x_end_user"]
                            if isinstance(carried["x_end_user"], str) else None)
    known = {name: found.pop(name) for name in ExtensionFields.model_fields if name in found}
    keyed = identity is not None and identity.keyed
    for name, header in _HEADERS.items():
        if known.get(name) is None and header in headers \
                and not (keyed and name == "x_client_id"):
            known[name] = _header_value(name, headers[header])
    if not known:  # most requests: nothing to validate
        return Extensions(extra=found, forwarded=forwarded, identity=identity)
    fields = parse(ExtensionFields, known)
    return Extensions(client_id=fields.x_client_id, priority=fields.x_priority,
                      budget_s=fields.x_budget_s, keep_alive_s=fields.x_keep_alive_s,
                      task=fields.x_task, thinking=fields.x_thinking,
                      session_id=fields.x_session_id, extra=found,
                      forwarded=forwarded, identity=identity)
