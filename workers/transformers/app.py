"""The worker's HTTP surface.

    GET  /health          200 once loaded (also while parked in RAM), 503 loading or failed
    POST /v1/embeddings   OpenAI's body and answer (embedding task)
    POST /v1/rerank       {query, documents, top_n?, return_documents?} (rerank task; also
                          /rerank): results by relevance, as llama.cpp, Jina and Cohere answer
                          (an embedding's or rerank's answer carries ``timings``: the batch it
                          ran in: its items and requests, the request's wait and its run in ms)
    POST /v1/audio/transcriptions, /v1/audio/translations
                          {file: base64, language?, prompt?, temperature?, response_format?,
                          timestamp_granularities?} (stt task): json, text, srt, vtt or
                          verbose_json, as OpenAI answers
    POST /v1/audio/speech {input, voice?, speed?, response_format?} (tts task): audio, streamed
                          sentence by sentence where the format allows; a VibeVoice reads
                          ``input`` as a script and speaks it in reference voices:
                          {voices?, voice_audio: [base64 recording per speaker], seed?}
                          (workers/transformers/vibevoice.py), streamed as generated
    POST /batch           {path, parts: [body, ...]}: embedding or rerank requests gathered by
                          the coordinator, answered framed (workers/transformers/parts.py)
    POST /cancel          {"request_id"} (every model request takes an optional
                          ``request_id``), or no body: every running request; a transcription
                          stops at its next chunk, speech at its next sentence, an embedding or
                          rerank request still waiting in the batcher leaves it (409 cancelled)
    POST /offload         weights to CPU RAM;  POST /onload  back to the device
    POST /load            a spare (``--spare``) takes its model: {"args": [model flags],
                          "cuda_visible_devices"?}; answers as /health once loaded (409 on
                          a worker that is no spare)
    POST /shutdown        stop the server

Requests on a parked (offloaded) model answer 409 ``model_offloaded``: the coordinator onloads
it first, so one never runs on the CPU copy. With an API key every route answers 401 without
``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from ..auth import require_key
from ..spare import InvalidOptions, LoadRequest
from ..tickets import Ticket
from . import speech
from .audio import AudioError, Encoder, decode
from .batcher import Batcher
from .cancel import Cancelled, Tickets
from .engine import Busy, Engine, NotLoaded
from .errors import WorkerError
from .options import load_args
from .parts import add_batch_route
from .vibevoice import read_script, spoken, voice_samples

log = logging.getLogger(__name__)

Text = Annotated[StrictStr, Field(min_length=1)]
RequestId = Annotated[StrictStr | None, Field(default=None, min_length=1, max_length=128)]


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: Text | list[Any] = Field(description="a string or an array of strings")
    encoding_format: str = "float"
    dimensions: int | None = Field(default=None, ge=1)
    model: str | None = None
    request_id: RequestId = None


class Document(BaseModel):
    text: Text


class RerankBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: Text
    documents: list[Text | Document] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    model: str | None = None
    request_id: RequestId = None


TRANSCRIPTS = ("json", "text", "srt", "vtt", "verbose_json")


class TranscriptionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    file: StrictStr = Field(min_length=1, description="the audio file's bytes, base64")
    filename: str | None = None
    language: str | None = Field(default=None, min_length=2, max_length=16)
    prompt: str | None = Field(default=None, max_length=4096)
    temperature: float = Field(default=0.0, ge=0, le=1)
    response_format: Literal["json", "text", "srt", "vtt", "verbose_json"] = "json"
    timestamp_granularities: list[Literal["word", "segment"]] = Field(default_factory=list)
    model: str | None = None
    request_id: RequestId = None


class SpeechBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: Text = Field(max_length=4096)
    voice: str | None = None
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    # a voice-cloning model's (VibeVoice): one voice name per speaker, and the coordinator's
    # recordings for them (base64 files, in the same order)
    voices: list[Annotated[StrictStr, Field(min_length=1)]] | None = Field(
        default=None, min_length=1)
    voice_audio: list[StrictStr] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    model: str | None = None
    request_id: RequestId = None


class CancelBody(BaseModel):
    request_id: RequestId = None


def create_app(engine: Engine, *, shutdown: Callable[[], None] | None = None,
               api_key: str | None = None) -> FastAPI:
    def run(items: list[Any]) -> Any:  # the task is known once the model is (a spare's later)
        return (engine.embed if engine.options.task == "embedding" else engine.rerank)(items)

    batcher = Batcher(run, engine.options.batch_size, engine.options.max_batch_wait_ms / 1000)
    kinds = {"embedding": "embeddings", "rerank": "rerank", "stt": "transcriptions",
             "tts": "speech"}
    tickets = Tickets()

    @contextmanager
    def admitted(request_id: str | None) -> Iterator[Ticket]:
        """The request's ticket while it runs; one a cancel stopped is counted and logged."""
        ticket, stopped = tickets.open(request_id), False
        try:
            ticket.check()  # a cancel that came before its request
            yield ticket
        except Cancelled:
            stopped = True
            raise
        finally:
            tickets.close(ticket, stopped=stopped)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        loading = asyncio.create_task(asyncio.to_thread(
            lambda: None if engine.state == "spare" else engine.load()))
        yield
        loading.cancel()
        await batcher.stop()

    app = FastAPI(title="transformers worker", lifespan=lifespan)

    require_key(app, api_key,
                lambda: WorkerError(401, "missing or wrong API key", "invalid_api_key").response())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        return WorkerError(400, message, "invalid_value", param).response()

    @app.exception_handler(WorkerError)
    async def _worker_error(_request: Request, exc: WorkerError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(NotLoaded)
    async def _not_loaded(_request: Request, exc: NotLoaded) -> JSONResponse:
        if str(exc) == "offloaded":
            return WorkerError(409, "the model is parked in CPU RAM", "model_offloaded").response()
        if str(exc) == "spare":
            return WorkerError(503, "this worker has no model yet (a spare)",
                               "not_ready").response()
        return WorkerError(503, f"the model is {exc}", "not_ready").response()

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {**engine.report(), "batches": batcher.batches, "largest_batch": batcher.largest,
                "running": tickets.running(), "cancelled": tickets.cancelled,
                "last_cancelled": tickets.last_cancelled,
                "last_stop_ms": tickets.last_stop_ms}
        ok = engine.state in ("ready", "offloaded")
        return JSONResponse(body, status_code=200 if ok else 503)

    def _serves(task: str) -> None:
        if engine.state == "spare":
            raise NotLoaded("spare")
        if engine.options.task != task:
            raise WorkerError(400, f"this model is of kind '{engine.options.task}'; it does not "
                              f"serve {kinds[task]}", "unsupported_endpoint", "model")
        if engine.state != "ready":
            raise NotLoaded(engine.state)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsBody) -> Response:
        _serves("embedding")
        texts = _texts(body.input, engine.options.max_items)
        if body.encoding_format not in ("float", "base64"):
            raise WorkerError(400, "encoding_format: must be 'float' or 'base64'",
                              "invalid_value", "encoding_format")
        if body.dimensions is not None and body.dimensions > (engine.dimensions or 0):
            raise WorkerError(400, f"dimensions: at most {engine.dimensions} for this model",
                              "invalid_value", "dimensions")
        with admitted(body.request_id) as ticket:
            embedded, batch = await batcher.answer(texts, ticket)
        tokens = sum(n for _, n in embedded)
        data = [{"object": "embedding", "index": i,
                 "embedding": _encode(_shorten(v, body.dimensions), body.encoding_format)}
                for i, (v, _) in enumerate(embedded)]
        # orjson writes the float32 vectors straight from numpy (FastAPI's encoder would walk
        # every float in Python: most of a small request's time)
        return Response(orjson.dumps({"object": "list", "data": data, "model": body.model or "",
                                      "usage": {"prompt_tokens": tokens,
                                                "total_tokens": tokens},
                                      "timings": batch},
                                     option=orjson.OPT_SERIALIZE_NUMPY),
                        media_type="application/json")

    async def rerank(body: RerankBody) -> dict[str, Any]:
        _serves("rerank")
        documents = [d if isinstance(d, str) else d.text for d in body.documents]
        if len(documents) > engine.options.max_items:
            raise WorkerError(400, f"documents: at most {engine.options.max_items}",
                              "invalid_value",
                              "documents")
        with admitted(body.request_id) as ticket:
            scored, batch = await batcher.answer([(body.query, d) for d in documents], ticket)
        scores = [score for score, _ in scored]
        order = sorted(range(len(documents)), key=lambda i: -scores[i])[:body.top_n]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": documents[i]}} if body.return_documents else {})}
                   for i in order]
        tokens = sum(n for _, n in scored)
        return {"id": f"rerank-{uuid.uuid4().hex[:16]}", "model": body.model or "",
                "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "timings": batch}  # the batch it ran in (batcher.BATCH_FIGURES)

    app.post("/v1/rerank")(rerank)
    app.post("/rerank")(rerank)
    add_batch_route(app, {"/v1/embeddings": (EmbeddingsBody, embeddings),
                          "/v1/rerank": (RerankBody, rerank)})

    async def transcribe(body: TranscriptionBody, task: str) -> Response:
        _serves("stt")
        if task == "translate" and not engine.whisper:
            raise WorkerError(400, "this model transcribes only; translation into English "
                              "needs a Whisper model", "unsupported_endpoint", "model")
        try:
            data = base64.b64decode(body.file, validate=True)
        except ValueError:
            raise WorkerError(400, "file: not base64", "invalid_value", "file") from None
        words = "word" in body.timestamp_granularities and body.response_format == "verbose_json"
        if words and engine.whisper:
            raise WorkerError(400, "timestamp_granularities: this model gives segment "
                              "timestamps only", "invalid_value", "timestamp_granularities")
        with admitted(body.request_id) as ticket:
            try:
                samples = await asyncio.to_thread(decode, data, engine.rate, ticket.check)
            except AudioError as exc:
                raise WorkerError(400, f"file: {exc}", "invalid_audio", "file") from None
            ticket.check()
            heard = await asyncio.to_thread(
                engine.transcribe, samples, task=task,
                language=body.language if task == "transcribe" else None, prompt=body.prompt,
                temperature=body.temperature, words=words, ticket=ticket)
        if task == "translate":
            heard["language"] = "en"
        return speech.transcript(heard, body.response_format, task)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(body: TranscriptionBody) -> Response:
        return await transcribe(body, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(body: TranscriptionBody) -> Response:
        return await transcribe(body, "translate")

    @app.post("/v1/audio/speech")
    async def speak(body: SpeechBody) -> Response:
        _serves("tts")
        if engine.clones_voices:
            return await speak_in_voices(body)
        speaker = speech.speaker(body.voice, engine.speakers)
        if body.speed != 1.0 and not engine.sets_speed:
            raise WorkerError(400, "speed: this model speaks at one speed; send 1.0",
                              "invalid_value", "speed")
        pieces = speech.sentences(body.input)
        encoder = Encoder(body.response_format, engine.rate or 16000)
        # a cancel stops it before its next sentence; a stream keeps its ticket till it ends
        ticket = tickets.open(body.request_id)

        async def piece(text: str) -> bytes:
            samples = await asyncio.to_thread(engine.synthesize, text, speed=body.speed,
                                              speaker=speaker, ticket=ticket)
            return encoder.add(samples)

        async def audio() -> AsyncIterator[bytes]:
            for text in pieces:
                yield await piece(text)
            yield encoder.close()

        return await answer_audio(audio(), encoder, ticket)

    async def speak_in_voices(body: SpeechBody) -> Response:
        """A VibeVoice: the script in its reference voices, streamed as it is generated."""
        param = "voices" if body.voices is not None else "voice"
        names = body.voices if body.voices is not None else [body.voice or ""]
        if body.voice_audio is None or len(body.voice_audio) != len(names):
            raise WorkerError(400, f"{param}: this model speaks in reference voices; name "
                              "them (the coordinator sends their recordings)",
                              "invalid_value", param)
        if body.speed != 1.0:
            raise WorkerError(400, "speed: this model speaks at one speed; send 1.0",
                              "invalid_value", "speed")
        script = read_script(body.input, len(names), param)
        rate = engine.rate or 24000
        voices = await asyncio.to_thread(voice_samples, body.voice_audio, names, param, rate)
        encoder = Encoder(body.response_format, rate)
        ticket = tickets.open(body.request_id)
        audio = spoken(lambda heard: engine.speak_in_voices(script, voices, body.seed, heard,
                                                            ticket), encoder, ticket.cancel)
        return await answer_audio(audio, encoder, ticket)

    async def answer_audio(audio: AsyncIterator[bytes], encoder: Encoder,
                           ticket: Ticket) -> Response:
        """Encoded audio as the answer: whole in the formats written whole, else streamed
        once its first piece is made (a failure before that is a status; after it, the
        stream ends short). A stream keeps its ticket till it ends."""
        streaming = False
        try:
            if not encoder.streamable:
                return Response(b"".join([piece async for piece in audio]),
                                media_type=encoder.content_type)
            first = await anext(audio)
            streaming = True
        except Cancelled:
            tickets.close(ticket, stopped=True)
            raise
        finally:
            if not streaming:
                tickets.close(ticket)

        async def stream():
            try:
                yield first
                async for piece in audio:
                    yield piece
                response.finished = True
            except Cancelled:  # the answer has begun: it ends short
                return
            finally:
                await audio.aclose()  # type: ignore[attr-defined]

        response = speech.EndingStream(
            stream(), lambda finished: tickets.close(ticket, stopped=not finished),
            encoder.content_type)
        return response

    @app.post("/cancel")
    async def cancel(body: CancelBody | None = None) -> dict[str, Any]:
        return tickets.cancel(body.request_id if body else None)

    @app.post("/offload")
    async def offload() -> dict[str, Any]:
        return await asyncio.to_thread(engine.offload)

    @app.post("/onload")
    async def onload() -> dict[str, Any]:
        return await asyncio.to_thread(engine.onload)

    @app.post("/load")
    async def load_model(body: LoadRequest) -> JSONResponse:
        try:
            options = load_args(engine.options, body.args)
        except InvalidOptions as exc:
            raise WorkerError(400, f"args: {exc}", "invalid_value", "args") from None
        try:
            engine.assign(options)
        except Busy as exc:
            raise WorkerError(409, str(exc), "busy") from None
        batcher.batch_size = options.batch_size
        batcher.max_wait_s = options.max_batch_wait_ms / 1000
        if body.cuda_visible_devices is not None:  # CUDA reads it at its first use, below
            os.environ["CUDA_VISIBLE_DEVICES"] = body.cuda_visible_devices
        await asyncio.to_thread(engine.load)
        return await health()

    @app.post("/shutdown")
    async def shutdown_now() -> dict[str, Any]:
        if shutdown is not None:
            shutdown()
        return {"stopping": True}

    return app


def _texts(value: Any, limit: int) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise WorkerError(400, "input: must not be empty", "invalid_value", "input")
    if len(texts) > limit:
        raise WorkerError(400, f"input: at most {limit} texts in one request",
                          "invalid_value", "input")
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise WorkerError(400, f"input.{position}: token arrays are not taken by this "
                              "model; send text", "invalid_value", "input")
        if not text:
            raise WorkerError(400, f"input.{position}: must not be an empty string",
                              "invalid_value", "input")
    return texts


def _shorten(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first ``dimensions`` values, scaled back to unit length (as OpenAI's do)."""
    if dimensions is None or dimensions >= vector.size:
        return vector
    head = vector[:dimensions]
    norm = float(np.sqrt(np.dot(head, head))) or 1.0
    return (head / norm).astype(np.float32)


def _encode(vector: np.ndarray, encoding: str) -> np.ndarray | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector
