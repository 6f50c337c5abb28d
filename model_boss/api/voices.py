"""Reference voices of the voice-cloning models (catalog/voices.py), a user route:

    GET    /api/v1/voices[?model=]          the voices of the models the key may use
    POST   /api/v1/voices                   multipart: model, name, file (any audio FFmpeg
                                            reads) → 201 and the voice
    DELETE /api/v1/voices/{name}[?model=]   an added voice (a key deletes the ones it added;
                                            an admin's key any)

Any key whose scope takes the model may list, add and use its voices: a voice is input to
that model's speech, as a request's text is, so the model's scope is the voice's (a model
outside the scope is as if it did not exist: 404).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from ..catalog.catalog import CatalogEntry
from ..catalog.voices import clones_voices, voice_store
from ..errors import BadRequest, Forbidden, ModelNotFound, NotFound
from ..tenancy.keys import identity_of, sees
from .context import coordinator_of
from .errors import OpenAIError, documented

router = APIRouter(tags=["voices"], responses=documented(OpenAIError))

VOICES_PATH = "/api/v1/voices"


def _cloning_models(request: Request, model: str | None) -> list[CatalogEntry]:
    """The voice-cloning models the caller may use (``model``'s alone when named)."""
    coord, identity = coordinator_of(request), identity_of(request.scope)
    if model is not None:
        entry = coord.catalog.find(model)
        if entry is None or not sees(identity, entry.manifest.names):
            raise ModelNotFound(f"The model '{model}' does not exist", param="model")
        if not clones_voices(entry.path):
            raise BadRequest(f"model: '{entry.manifest.id}' does not speak in reference "
                             "voices (a VibeVoice does)", param="model",
                             code="unsupported_model")
        return [entry]
    return [e for e in coord.catalog if e.manifest.base is None and clones_voices(e.path)
            and sees(identity, e.manifest.names)]


@router.get(VOICES_PATH)
async def list_voices(request: Request, model: str | None = None) -> dict[str, Any]:
    store = voice_store(coordinator_of(request).settings.state_path)
    entries = _cloning_models(request, model)
    voices = await asyncio.to_thread(
        lambda: [v.card() for e in entries for v in store.voices(e.manifest.id, e.path)])
    return {"object": "list", "data": voices}


@router.post(VOICES_PATH, status_code=201)
async def add_voice(request: Request) -> dict[str, Any]:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequest("send the voice as multipart/form-data: 'model', 'name' and a "
                         "'file' part", code="invalid_content_type")
    async with request.form(max_files=1, max_fields=8) as form:
        fields = {name: value for name, value in form.multi_items()}
        upload = fields.get("file")
        data = await upload.read() if isinstance(upload, UploadFile) else None
    for field in ("model", "name"):
        if not isinstance(fields.get(field), str) or not fields[field]:
            raise BadRequest(f"{field}: required (a form field)", param=field,
                             code="missing_field")
    if data is None:
        raise BadRequest("file: required (the recording, as a file part)", param="file",
                         code="missing_field")
    entry = _cloning_models(request, str(fields["model"]))[0]
    store = voice_store(coordinator_of(request).settings.state_path)
    voice = await asyncio.to_thread(store.add, entry.manifest.id, entry.path,
                                    str(fields["name"]), data, identity_of(request.scope).key
                                    if identity_of(request.scope) else None)
    return voice.card()


@router.delete(VOICES_PATH + "/{name}")
async def delete_voice(request: Request, name: str, model: str | None = None
                       ) -> dict[str, Any]:
    identity = identity_of(request.scope)
    store = voice_store(coordinator_of(request).settings.state_path)
    found = [v for e in _cloning_models(request, model) for v in store.added(e.manifest.id)
             if v.name == name]
    if not found:
        raise NotFound(f"no added voice {name!r}" + (f" of '{model}'" if model else ""),
                       param="name")
    if len(found) > 1:
        raise BadRequest(f"model: {len(found)} models have a voice {name!r}; name one "
                         "(?model=)", param="model", code="ambiguous_voice")
    voice = found[0]
    if identity is not None and identity.keyed and not identity.admin \
            and voice.added_by != identity.key:
        raise Forbidden(f"voice {name!r} was added by another key", param="name")
    await asyncio.to_thread(store.remove, voice.model, voice.name)
    return {"name": voice.name, "model": voice.model, "deleted": True}
