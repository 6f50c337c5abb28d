"""Forwarding decided early: a request whose model is warm on another member goes there
before any schema is checked or any route is chosen here.

A forward is most of what such a request costs this member, so the decision reads no more
than it needs: the JSON body (orjson), the ``model`` it names, the extensions and the
members' records in memory. Whatever is not a plain case (a task, a client limited to some
models, a model cold everywhere, busy or ready here, a body that does not parse, a bad
extension) is left to the full path, which answers it as before: this module only ever says
"forward this, now", never "refuse". The member that serves the request checks its body,
so a bad one comes back as that member's 400, relayed.

What the full path carries is carried the same way: :func:`~.clustered.forward_body` with
the client id and the priority resolved here, the budget and keep-alive as asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..catalog.tasks import task_name
from ..cluster import FORWARDED_HEADER, MemberRecord
from ..endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RERANK, RESPONSES, SPEECH
from ..errors import ModelBossError
from ..scheduling.replicas import prompt_blocks
from ..tenancy.keys import Identity
from .accounting import who
from .clustered import forward_body, forward_to
from .extensions import pop_extensions
from .serving import effective_priority

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from .served import Served

# the OpenAI routes whose HTTP path is the endpoint members answer on
EARLY_PATHS = frozenset({CHAT, COMPLETIONS, EMBEDDINGS, RERANK, RESPONSES, SPEECH})


@dataclass(frozen=True, slots=True)
class EarlyForward:
    """A request to send on to ``member`` as it is: ``body`` is what the member gets."""

    member: MemberRecord
    endpoint: str
    model_id: str
    body: dict[str, Any]


def early_forward(coord: Coordinator, endpoint: str, raw: bytes,
                  headers: Mapping[str, str], identity: Identity | None) -> EarlyForward | None:
    """The forward of this request when it can be decided now; None: take the full path.
    Synchronous and without I/O: it reads only what is in memory."""
    cluster = coord.cluster
    if cluster is None or endpoint not in EARLY_PATHS or FORWARDED_HEADER in headers:
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or task_name(model) is not None:
        return None
    entry = coord.catalog.find(model)
    if entry is None:
        return None
    manifest = entry.manifest
    route = cluster.warm_route(manifest.id, prompt_blocks(body))
    if route is None or route.member is None:
        return None
    try:
        coord.catalog.get_available(manifest.id)
        ext = pop_extensions(body, headers, identity)
    except ModelBossError:
        return None
    asker = who(coord, ext, body)
    profile = asker.profile
    if ext.task is not None or (profile is not None and profile.allowed_models is not None):
        return None
    priority = effective_priority(coord.settings, ext.priority, profile, manifest=manifest)
    body["model"] = manifest.id
    return EarlyForward(route.member, endpoint, manifest.id, forward_body(
        body, ext, client_id=asker.client_id, priority=priority, budget_s=ext.budget_s))


async def send_early(coord: Coordinator, early: EarlyForward) -> Served:
    """Forward it; raises :class:`~model_boss.cluster.MemberUnreachable` when the member
    cannot be reached (nothing was answered yet: the full path serves it here)."""
    return await forward_to(coord, early.member, early.endpoint, early.model_id, early.body)
