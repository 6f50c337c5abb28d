"""Identity: who one request is, as the edge decided it from its key (never from its body)."""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .policy import model_in_scope

if TYPE_CHECKING:
    from .record import KeyRecord

# where the edge leaves it in the ASGI scope (Starlette's ``request.state.identity``)
STATE_FIELD = "identity"


@dataclass(frozen=True, slots=True)
class Identity:
    """The key a request came with (``key``: its name; None where no keys are configured),
    whether that key is an admin's, the key's record (scope and limits) when it is a managed
    or named key, and ``end_user``: the client id, ``user`` or ``metadata.user_id`` the
    request sent, a label under the key that never widens it."""

    key: str | None = None
    admin: bool = False
    record: KeyRecord | None = None
    end_user: str | None = None


# the identity of the request served in this context (the edge sets it for the request's
# whole life; the serving path reads it where it parses the body)
CURRENT_IDENTITY: ContextVar[Identity | None] = ContextVar("identity", default=None)


LABEL_CHARS = 200  # the longest end user label kept
# the fields of a label sent as a JSON object that name its user, best first (Claude Code's
# metadata.user_id is {"device_id", "account_uuid", "session_id"} in a string)
LABEL_FIELDS = ("user_id", "account_uuid", "session_id")


def end_user_label(sent: str) -> str:
    """The end user label a request's ``sent`` value makes: a JSON object in a string gives
    its first non-empty ``LABEL_FIELDS`` value (not the whole blob); anything else is
    itself. Cut to ``LABEL_CHARS``."""
    if sent.startswith("{"):
        try:
            fields = json.loads(sent)
        except ValueError:
            fields = None
        if isinstance(fields, dict):
            sent = next((value for name in LABEL_FIELDS
                         if isinstance(value := fields.get(name), str) and value), sent)
    return sent[:LABEL_CHARS]


def identity_of(scope: dict[str, Any]) -> Identity | None:
    """The identity the edge set on ``scope`` (None: the edge set none, no keys configured)."""
    state = scope.get("state")
    return state.get(STATE_FIELD) if isinstance(state, dict) else None


def with_identity(scope: dict[str, Any], identity: Identity) -> dict[str, Any]:
    """``scope`` with ``identity`` set (a new state dict: the caller's is left as it was)."""
    return dict(scope, state={**(scope.get("state") or {}), STATE_FIELD: identity})


def sees(identity: Identity | None, names: tuple[str, ...] | list[str]) -> bool:
    """Whether a request of ``identity`` may know of a model called ``names`` (its id and
    aliases): a key's model scope hides the rest from lists as it refuses them."""
    if identity is None or identity.record is None:
        return True
    return model_in_scope(identity.record.profile, names)
