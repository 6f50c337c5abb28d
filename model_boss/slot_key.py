"""SlotKey: the name of one copy of a model, as against the model's own id.

A model served as replicas runs as several slots: its first copy is keyed by the model's id,
copy ``n`` by ``id#n``. Whatever is counted or decided per copy (a busy clock and the load
already charged, a lease, an eviction, a row of the request log) is keyed by a ``SlotKey``;
whatever is per model (the catalog, a key's scope, a request's ``model``) by the model id.
"""

from __future__ import annotations

from typing import NewType

SlotKey = NewType("SlotKey", str)


def slot_key(model_id: str, replica: int = 1) -> SlotKey:
    """The key of ``model_id``'s copy ``replica`` (the first copy's is the model's id)."""
    return SlotKey(model_id if replica == 1 else f"{model_id}#{replica}")


def model_of(key: SlotKey | str) -> str:
    """The model a copy's key names."""
    return key.split("#", 1)[0]
