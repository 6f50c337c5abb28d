"""``/v1/realtime`` end to end through the official ``openai`` client's realtime connection: a
spoken question (espeak-ng, PCM16 at 24 kHz in 20 ms chunks, sent in real time) heard by
silero-vad, transcribed by a tiny Whisper, answered by the demo LLM and spoken by a tiny VITS
voice, each a request through the queue of one coordinator shared by the module."""

from __future__ import annotations

import asyncio
import base64
import importlib.util

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.lazy_modules import lazy
from tests.realtime_fixtures import needs_espeak, silence, spoken
from tests.transformers_fixtures import build_voice, build_whisper, shared

openai = lazy("openai")
websockets = lazy("websockets")

pytestmark = [pytest.mark.slow, needs_espeak,
              pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None
                                 or importlib.util.find_spec("transformers") is None,
                                 reason="the 'realtime' and 'transformers' extras")]

CHUNK = 480 * 2  # 20 ms of PCM16 at 24 kHz


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    manifests = [
        {"id": "whisper", "backend": "transformers", "category": "stt",
         "path": str(shared(tmp_path_factory, "whisper", build_whisper)), "vram_mb": 500},
        {"id": "voice", "backend": "transformers", "category": "tts",
         "path": str(shared(tmp_path_factory, "voice", build_voice)), "vram_mb": 500},
        # greedy: the same question gets the same answer, run after run
        llama_manifest("smol", demo_gguf, vram_mb=500, args=["--temp", "0"]),
        {"id": "talk", "category": "realtime",
         "pipeline": {"transcriber": "whisper", "llm": "smol", "voice": "voice"}},
        {"id": "mute", "category": "realtime",
         "pipeline": {"transcriber": "whisper", "llm": "smol", "voice": "whisper"}},
    ]
    srv = ServerProcess(tmp_path_factory.mktemp("realtime"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 4000}]}, manifests)
    srv.start()
    yield srv
    srv.stop()


def _client(server: ServerProcess):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


async def _until(conn, kind: str, seen: list) -> object:
    async with asyncio.timeout(60):
        while True:
            event = await conn.recv()
            seen.append(event)
            if event.type == kind:
                return event


async def test_a_spoken_question_is_answered_in_voice_with_events_in_order(server):
    question = silence(0.3) + spoken("What is the capital of France?") + silence(0.6)
    async with _client(server).realtime.connect(model="talk") as conn:
        seen: list = []
        created = await _until(conn, "session.created", seen)
        assert created.session.model == "talk"
        await conn.session.update(session={
            "type": "realtime", "instructions": "Answer in one short sentence.",
            "max_output_tokens": 16,
            "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": 400}}}})
        await _until(conn, "session.updated", seen)

        # a malformed event and an unknown one: error events, and the socket carries on
        await conn._connection.send("{not json")
        bad = await _until(conn, "error", seen)
        assert bad.error.code == "invalid_json"
        await conn.send({"type": "input_audio_buffer.shout", "event_id": "client-1"})
        unknown = await _until(conn, "error", seen)
        assert (unknown.error.code, unknown.error.event_id) == ("unknown_event", "client-1")
        assert "input_audio_buffer.shout" in unknown.error.message

        # a typed question first, answered in voice (the tiny Whisper hears noise: after it,
        # the demo model's answers may hold nothing a voice can say)
        seen.clear()
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Say hello to me."}]})
        await conn.response.create()
        spoken_done = await _until(conn, "response.done", seen)
        answered = list(seen)
        seen.clear()
        for at in range(0, len(question), CHUNK):  # in real time, as a microphone sends it
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(question[at:at + CHUNK]).decode())
            await asyncio.sleep(0.02)
        done = await _until(conn, "response.done", seen)
        heard = list(seen)


    kinds = [event.type for event in heard]
    assert "error" not in kinds, [e for e in heard if e.type == "error"]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "response.created",
             "conversation.item.input_audio_transcription.completed",
             "response.output_audio.done", "response.output_audio_transcript.done",
             "response.done"]
    firsts = [kinds.index(kind) for kind in order]
    assert firsts == sorted(firsts), kinds
    assert done.response.status == "completed"
    assert done.response.usage.output_tokens > 0
    stopped = heard[kinds.index("input_audio_buffer.speech_stopped")]
    assert 1500 < stopped.audio_end_ms < len(question) / 48

    kinds = [event.type for event in answered]
    assert "error" not in kinds, [e for e in answered if e.type == "error"]
    order = ["conversation.item.added", "response.created",
             "response.output_audio_transcript.delta", "response.output_audio.delta",
             "response.output_audio.done", "response.output_audio_transcript.done",
             "response.done"]
    firsts = [kinds.index(kind) for kind in order]
    assert firsts == sorted(firsts), kinds
    assert spoken_done.response.status == "completed"
    transcript = next(e for e in answered if e.type == "response.output_audio_transcript.done")
    pcm = b"".join(base64.b64decode(e.delta) for e in answered
                   if e.type == "response.output_audio.delta")
    assert transcript.transcript and len(pcm) % 2 == 0 and pcm.strip(b"\0")
    # the voice speaks at 16 kHz: at the asked 24 kHz its answer lasts as long as the same
    # words asked of it over HTTP
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        said = (await http.post("/v1/audio/speech", json={
            "model": "voice", "input": transcript.transcript, "response_format": "pcm"})).content
    assert abs(len(pcm) / 48000 - len(said) / 32000) < 0.25 * len(said) / 32000 + 0.2


async def test_an_unknown_or_unavailable_pipeline_is_refused_before_audio(server):
    client = _client(server)
    for model, status, words in [("nobody", 404, "does not exist"),
                                 ("smol", 400, "not a realtime pipeline"),
                                 ("mute", 503, "pipeline.voice: 'whisper' is a stt model")]:
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with client.realtime.connect(model=model):
                pass
        response = refused.value.response
        assert response.status_code == status
        assert words in response.body.decode()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        listed = (await http.get("/v1/models/mute")).json()
    assert "pipeline.voice" in (listed.get("unavailable_reason") or "")
