"""Admission: a key's kind of route, rates and quotas, checked at the door of an inference
route before the body is read (:class:`~.keys.KeyAdmission`); a refusal is answered in the
route's envelope and told to ``/api/v1/events`` as ``key_refused``."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ...coordinator import Coordinator
from ...observability import tracing
from ...tenancy.keys import identity_of
from ..errors import error_response
from .keys import JOBS_PATH, KeyAdmission
from .tracing import edge_stage, told


class Admission:
    def __init__(self, app: ASGIApp, coordinator: Coordinator,
                 inference: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.coord = coordinator
        self.inference = inference | {JOBS_PATH}
        self.admission = KeyAdmission(coordinator.key_windows, coordinator.usage_spent)
        self.traced = tracing.on()  # off, no span is asked for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" \
                and scope["path"] in self.inference:
            who = identity_of(scope)
            if who is not None and who.record is not None:
                if self.traced:  # the key's rates and quotas as the request span's child
                    with edge_stage("model_boss.admission") as stage:
                        refused = self.admission.admit(who.record, scope["path"])
                        told(stage, refused=refused, who=who)
                else:
                    refused = self.admission.admit(who.record, scope["path"])
                if refused is not None:
                    self.coord.events.emit("key_refused", key=who.record.name,
                                          code=refused.code, path=scope["path"])
                    await error_response(refused)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
