"""Identity: who one request is, as the edge decided it from its key (never from its body).

The edge decides it once per request and leaves it in the request's scope
(:func:`with_identity`); everything after reads it there through :func:`identity_of`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .policy import model_in_scope

if TYPE_CHECKING:
    from .record import KeyRecord

# where the edge leaves it in the ASGI scope (Starlette's ``request.state.identity``)
STATE_FIELD = "identity"


@dataclass(frozen=True, slots=True)
class Identity:
    """The key a request came with (``key``: its name; None where no key decided: no keys
    configured, or a route no key guards), whether that key is an admin's, the key's record
    (scope and limits), and ``end_user``: the client id the request named in ``X-Client-Id``.
    Under a key that is a label that never widens it (cut and read as
    :func:`end_user_label`); without one it is the client itself, as sent."""

    key: str | None = None
    admin: bool = False
    record: KeyRecord | None = None
    end_user: str | None = None

    @property
    def keyed(self) -> bool:
        return self.key is not None

    @property
    def client(self) -> str | None:
        """Whom per-client limits count at the edge: the key where one decided, else the
        client id the request named (None: it named none)."""
        return self.key if self.key is not None else self.end_user


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
