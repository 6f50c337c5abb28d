"""``/v1/realtime``: OpenAI's Realtime API over a WebSocket, on a realtime pipeline of the
box's own models (``?model=`` names it). The edge has checked the Host, the Origin and the
key; here, before the socket is accepted, the pipeline is found, the key's scope (all three
models, the ``realtime`` kind of route), rates and quotas checked, and the three models
planned together (:class:`~model_boss.services.realtime.OpenSessions`): a refusal is an HTTP
answer in the error envelope, before any audio is taken. Then each text frame is one client
event for :class:`~model_boss.services.realtime.RealtimeSession`, and each response asks the
key's rates again (:class:`KeyTurns`)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ..catalog import Category
from ..catalog.manifest import PipelineSpec
from ..endpoints import REALTIME
from ..errors import BadRequest, ModelBossError, ModelNotFound
from ..services.extensions import Extensions
from ..services.realtime import OpenSessions, RealtimeSession
from ..tenancy.keys import Identity, KeyRecord, identity_of, minute_left, sees
from .errors import error_response
from .middleware.keys import KeyAdmission

log = logging.getLogger(__name__)
router = APIRouter(tags=["openai"])
REALTIME_PATH = REALTIME


def _pipeline(coord: Any, model: str | None, identity: Identity | None) -> PipelineSpec:
    """The pipeline ``model`` names, servable and in the key's scope (all three of its
    models); the refusal otherwise, as a request for it would get."""
    if not model:
        raise BadRequest("model: required (?model= names a realtime pipeline)",
                         param="model", code="missing_field")
    entry = coord.catalog.find(model)
    if entry is None or not sees(identity, entry.manifest.names):
        raise ModelNotFound(f"The model '{model}' does not exist", param="model")
    if entry.manifest.category != Category.REALTIME or entry.manifest.pipeline is None:
        raise BadRequest(f"model: '{model}' is a {entry.manifest.category} model, not a "
                         "realtime pipeline", param="model", code="invalid_value")
    coord.catalog.get_available(model)
    pipeline = entry.manifest.pipeline
    for name in (pipeline.transcriber, pipeline.llm, pipeline.voice):
        member = coord.catalog.find(name)
        if member is None or not sees(identity, member.manifest.names):
            raise ModelNotFound(f"The model '{name}' of the pipeline '{model}' does not "
                                "exist", param="model")
    return pipeline


class KeyTurns:
    """A session key's rates and quotas, a response at a time (the session's ``gate``)."""

    def __init__(self, coord: Any, record: KeyRecord) -> None:
        self.coord, self.record = coord, record
        self.admission = KeyAdmission(coord.key_windows, coord.usage_spent)

    def admit(self) -> ModelBossError | None:
        return self.admission.admit(self.record, REALTIME_PATH)

    def rate_limits(self) -> list[dict[str, Any]]:
        now = time.time()
        return minute_left(self.record.profile,
                           self.coord.key_windows.reading(self.record.name, now), now)


@router.websocket(REALTIME_PATH)
async def realtime(websocket: WebSocket, model: str | None = None) -> None:
    coord = websocket.app.state.coordinator
    sessions: OpenSessions = websocket.app.state.realtime_sessions
    identity = identity_of(websocket.scope)
    ext = Extensions(identity=identity,
                     client_id=identity.end_user if identity and not identity.keyed else None)
    gate = KeyTurns(coord, identity.record) \
        if identity is not None and identity.record is not None else None
    try:
        if coord.drain.draining:
            raise coord.drain.refusal()
        pipeline = _pipeline(coord, model, identity)
        refused = gate.admit() if gate is not None else None  # opening counts as a request
        if refused is not None:
            coord.events.emit("key_refused", key=identity.record.name, code=refused.code,
                              path=REALTIME_PATH)
            raise refused
        priority = sessions.priority(ext)
        await sessions.check_fit(pipeline, priority)
    except ModelBossError as exc:
        await websocket.send_denial_response(error_response(exc))
        return
    async def emit(event: dict[str, Any]) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client has gone
            await websocket.send_text(orjson.dumps(event).decode())

    async def hang_up() -> None:
        with contextlib.suppress(Exception):  # closed already
            await websocket.close(code=1001)

    session = RealtimeSession(coord, str(model), pipeline, ext, emit, gate=gate,
                              hang_up=hang_up)
    sessions.add(session, ext, priority)  # held as planned, with no wait between
    try:
        # a browser offers "realtime" (beside its key): the handshake must name one it offered
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        await session.open()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            await session.handle(message.get("text") or message.get("bytes") or b"")
    except (WebSocketDisconnect, RuntimeError):  # gone, or closed by hang_up
        pass
    finally:
        await sessions.remove(session)
