"""``/v1/realtime``: OpenAI's Realtime API over a WebSocket, on a realtime pipeline of the
box's own models (``?model=`` names it). The edge has checked the Host, the Origin and the
key; here the pipeline is found and the key's scope checked before the socket is accepted
(a refusal is an HTTP answer in the error envelope, before any audio is taken), then each
text frame is one client event for :class:`~model_boss.services.realtime.RealtimeSession`."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ..catalog import Category
from ..catalog.manifest import PipelineSpec
from ..errors import BadRequest, ModelBossError, ModelNotFound
from ..services.extensions import Extensions
from ..services.realtime import RealtimeSession
from ..tenancy.keys import Identity, identity_of, sees
from .errors import error_response

log = logging.getLogger(__name__)
router = APIRouter(tags=["openai"])
REALTIME_PATH = "/v1/realtime"


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


@router.websocket(REALTIME_PATH)
async def realtime(websocket: WebSocket, model: str | None = None) -> None:
    coord = websocket.app.state.coordinator
    identity = identity_of(websocket.scope)
    try:
        pipeline = _pipeline(coord, model, identity)
    except ModelBossError as exc:
        await websocket.send_denial_response(error_response(exc))
        return
    # a browser offers "realtime" (beside its key): the handshake must name one it offered
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)

    async def emit(event: dict[str, Any]) -> None:
        await websocket.send_text(orjson.dumps(event).decode())

    ext = Extensions(identity=identity,
                     client_id=identity.end_user if identity and not identity.keyed else None)
    session = RealtimeSession(coord, str(model), pipeline, ext, emit)
    try:
        await session.open()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            await session.handle(message.get("text") or message.get("bytes") or b"")
    except WebSocketDisconnect:
        pass
    finally:
        await session.close()
