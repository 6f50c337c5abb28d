"""Accounting for one request: who it is to the queue and the ledger (:func:`who`: with
keys, the key decides), and what its answer said it used (:func:`read_figures`), or the row of
one that never got a slot (:func:`unserved_row`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends.base import UpstreamResponse
from ..endpoints import IMAGES
from ..errors import ModelBossError
from ..tenancy.keys import end_user_label
from ..tenancy.usage import Figures, UsageRow, outcome
from .extensions import Extensions

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..scheduling.queue import QueuedRequest
    from ..settings import ClientProfile

# the routes whose answers say how many seconds of audio they heard (transcriptions)
AUDIO_HEARD = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
AUDIO_SECONDS_HEADER = "x-audio-seconds"


@dataclass(frozen=True, slots=True)
class Who:
    """Who a request is to the queue and the ledger: the client the queue counts (the key's
    name where keys are configured, else the client id it gave), that client's profile, the
    key ("" without keys) and the end user it named under the key."""

    client_id: str
    profile: ClientProfile | None
    key: str = ""
    end_user: str = ""

    @property
    def keyed(self) -> bool:
        return bool(self.key)


def who(coord: Coordinator, ext: Extensions, body: dict[str, Any]) -> Who:
    """With keys, the key decides: its profile, whatever client id, ``user`` or
    ``metadata.user_id`` the request sends (those only label an end user under it)."""
    identity = ext.identity
    if identity is not None and identity.key is not None:
        record = identity.record or coord.keys.get(identity.key)
        profile = record.profile if record is not None \
            else coord.settings.clients.get(identity.key)
        user = body.get("user")
        named = ext.client_id if ext.client_id != identity.key else None
        end_user = named or (user if isinstance(user, str) else None) or identity.end_user
        return Who(identity.key, profile, identity.key, end_user_label(end_user or ""))
    client = ext.client_id or "anonymous"
    return Who(client, coord.settings.clients.get(client), "", ext.client_id or "")


def read_figures(figures: Figures, endpoint: str, body: dict[str, Any],
                 upstream: UpstreamResponse) -> None:
    """What a whole answer says it used: tokens, images and their steps, audio heard."""
    data = upstream.body or b""
    figures.read(data)
    if endpoint == IMAGES:
        figures.read_images(data)
        steps = body.get("num_inference_steps") or body.get("steps")
        figures.steps = figures.images * steps if isinstance(steps, int) else 0
    elif endpoint in AUDIO_HEARD:
        figures.read_audio(data, upstream.headers.get(AUDIO_SECONDS_HEADER))


def unserved_row(queued: QueuedRequest, exc: BaseException, member: str) -> UsageRow:
    """The ledger's row for a request that never got a slot (nothing of the GPU used)."""
    if isinstance(exc, ModelBossError):
        status = exc.status_code
    else:  # the client went away (or the daemon is stopping) while it waited
        status = 499
    return UsageRow(key=queued.key, end_user=queued.end_user, model=queued.model_id,
                    endpoint=queued.endpoint, outcome=outcome(False, status == 499, status),
                    http_status=status, request_id=queued.request_id, member=member,
                    queue_wait_s=round(time.time() - queued.submitted_at, 6))
