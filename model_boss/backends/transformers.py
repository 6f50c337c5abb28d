"""TransformersBackend: ``python -m workers.transformers`` — an embedder (sentence-transformers)
or a reranker (CrossEncoder), batching concurrent requests, or a speech recogniser or voice
(transformers' pipelines), with a CPU-RAM tier. Every request carries a ``request_id``: a
caller that goes away (client disconnect, job cancelled) sends ``POST /cancel`` for it, so a
long transcription or speech stops on the worker too, not only on the coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..catalog.manifest import Category, ModelManifest
from ..catalog.voices import clones_voices, voice_store
from ..endpoints import SPEECH
from ..errors import BadRequest
from ..gpu.placement import Placement, layers_on_gpu
from .base import HttpWorkerBackend, UpstreamResponse
from .gathering import GATHERED, Gathering
from .spare import TRANSFORMERS, TakesSpares, torch_defaults
from .worker_errors import upstream_error

# what each kind answers: the coordinator's endpoint → the worker's path
SERVES = {Category.EMBEDDING: {"/v1/embeddings": "/v1/embeddings"},
          Category.RERANK: {"/v1/rerank": "/v1/rerank"},
          Category.STT: {"/v1/audio/transcriptions": "/v1/audio/transcriptions",
                         "/v1/audio/translations": "/v1/audio/translations"},
          Category.TTS: {"/v1/audio/speech": "/v1/audio/speech"}}
TASKS = {Category.EMBEDDING: "embedding", Category.RERANK: "rerank", Category.STT: "stt",
         Category.TTS: "tts"}
STREAMED = frozenset({"/v1/audio/speech"})  # audio passed on as it is encoded
# a gathering is sent at the latest this many quiet waits after its first request
LONGEST_WAITS = 10
_JSON = {"content-type": "application/json"}
_BACKGROUND: set[asyncio.Task] = set()
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TransformersBackend(TakesSpares, HttpWorkerBackend):
    can_offload = True
    spare_kind = TRANSFORMERS
    health_path = "/health"
    secret_env = "WORKER_API_KEY"  # workers/transformers/options.py reads it
    _gathering: Gathering | None = None

    @staticmethod
    def serves(manifest: ModelManifest) -> list[str]:
        """The endpoints a model of this kind answers (checked before it is loaded)."""
        return list(SERVES.get(manifest.category, {}))

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        return [sys.executable, "-m", "workers.transformers", "--host", "127.0.0.1",
                "--port", str(port), "--parent-pid", str(os.getpid()),
                *self.model_flags(placement)]

    def model_flags(self, placement: Placement | None) -> list[str]:
        """The model's flags: a cold start's argv, a spare's ``POST /load``."""
        m = self.manifest
        layers = self.gpu_layers(placement)
        offload = ["--gpu-layers", str(layers)] if placement and placement.gpus \
            and layers >= 0 else []
        if offload and not m.offload_prefetch:
            offload.append("--no-offload-prefetch")
        return ["--model", str(self.entry.path), "--task", TASKS[m.category],
                "--device", "auto", "--dtype", m.dtype, "--batch-size", str(m.batch_size),
                "--max-batch-wait-ms", f"{m.max_batch_wait_ms:g}", *offload, *m.args]

    def gpu_layers(self, placement: Placement | None) -> int:
        """The model's repeated blocks kept on the GPU, the rest streamed from CPU RAM by the
        worker (workers/transformers/layers.py)."""
        return layers_on_gpu(placement, self.manifest.gpu_layers)

    def environment(self, placement: Placement | None) -> dict[str, str]:
        env = super().environment(placement)
        torch_defaults(env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        return env

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        served = SERVES.get(self.manifest.category, {})
        if endpoint not in served:
            routes = ", ".join(served) or "nothing"
            raise BadRequest(f"'{self.manifest.id}' is a model of kind "
                             f"'{self.manifest.category}'; it serves {routes}",
                             param="model", code="unsupported_endpoint")
        if endpoint == SPEECH and clones_voices(self.entry.path):
            body = await asyncio.to_thread(self._with_recordings, body)
        elif endpoint == SPEECH and body.get("voices") is not None:
            raise BadRequest(f"voices: '{self.manifest.id}' speaks one voice of its own at a "
                             "time (voice); voices names reference voices for a script's "
                             "speakers, on a voice-cloning model (VibeVoice)", param="voices")
        request_id = uuid.uuid4().hex
        sent = {**body, "model": self.manifest.id, "request_id": request_id}
        try:
            if endpoint in GATHERED:  # batched with the requests that come with it
                return await self.gathering().submit(served[endpoint], sent,
                                                     GATHERED[endpoint](body))
            answer = await self.proxy("POST", served[endpoint], sent,
                                      stream=endpoint in STREAMED)
        except asyncio.CancelledError:  # the caller went away: stop the worker's work too
            self._cancel(request_id)
            raise
        if answer.stream is not None:
            answer.stream = self._cancelled_when_left(answer.stream, request_id)
        return answer

    def _with_recordings(self, body: dict[str, Any]) -> dict[str, Any]:
        """A voice-cloning model's request with its voices' recordings (``voice_audio``),
        read here from the model's folder and the daemon's added voices: the worker gets
        audio, never a path; a name the model has not is a 400 naming the field."""
        param = "voices" if body.get("voices") is not None else "voice"
        names = body["voices"] if param == "voices" else [body.get("voice") or ""]
        store = voice_store(self.settings.state_path)
        return {**body, "voice_audio": store.recordings(self.manifest.id, self.entry.path,
                                                        names, param)}

    def gathering(self) -> Gathering:
        if self._gathering is None:
            m = self.manifest
            wait_s = m.max_batch_wait_ms / 1000
            self._gathering = Gathering(self._send_parts, m.batch_size, wait_s,
                                        wait_s * LONGEST_WAITS)
        return self._gathering

    async def _send_parts(self, path: str,
                          bodies: list[dict[str, Any]]) -> list[UpstreamResponse | Exception]:
        """One ``POST /batch`` for ``bodies``; each part's answer, or its error as it would
        have been alone."""
        answer = await self.proxy("POST", "/batch", {"path": path, "parts": bodies},
                                  stream=False)
        content = answer.body or b""
        head, _, rest = content.partition(b"\n")
        answers: list[UpstreamResponse | Exception] = []
        start = 0
        try:
            for status, length in orjson.loads(head):
                part = rest[start:start + length]
                start += length
                answers.append(UpstreamResponse(status, _JSON, body=part) if status < 400
                               else upstream_error(self.manifest.id, status, part))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            answers = []
        if len(answers) != len(bodies) or start != len(rest):
            raise upstream_error(self.manifest.id, 502, b"the worker's batch answer did not "
                                 b"match its parts")
        return answers

    def _cancel(self, request_id: str) -> None:
        """``POST /cancel`` in the background; by id, so a cancel that overtakes its request
        still stops it, and only it."""
        async def cancel() -> None:
            with contextlib.suppress(Exception):
                await self.control("/cancel", {"request_id": request_id})

        task = asyncio.create_task(cancel())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)

    async def _cancelled_when_left(self, stream: AsyncIterator[bytes],
                                   request_id: str) -> AsyncIterator[bytes]:
        """A stream (speech) its reader leaves before the end: cancelled on the worker, which
        stops before its next sentence."""
        finished = False
        try:
            async for chunk in stream:
                yield chunk
            finished = True
        finally:
            if not finished:
                self._cancel(request_id)
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def offload(self) -> dict[str, Any]:
        return await self.control("/offload")

    async def onload(self) -> dict[str, Any]:
        return await self.control("/onload")

    async def report(self) -> dict[str, Any]:
        return await self.worker_report("/health")
