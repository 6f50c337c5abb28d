"""``/v1/realtime`` end to end through the official ``openai`` client's realtime connection: a
spoken question (espeak-ng, PCM16 at 24 kHz in 20 ms chunks, sent in real time) heard by
silero-vad, transcribed by a tiny Whisper, answered by the demo LLM and spoken by a tiny VITS
voice, each a request through the queue of one coordinator shared by the module."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import os
import signal
import sqlite3
import time

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.lazy_modules import lazy
from tests.realtime_fixtures import needs_espeak, silence, spoken
from tests.transformers_fixtures import build_voice, build_whisper, shared

openai = lazy("openai")
websocket_errors = lazy("websockets.exceptions")

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
        # fits alone, never beside the other two on the 4000 MB GPU (3488 MB past the margin)
        llama_manifest("smol-big", demo_gguf, vram_mb=3200),
        {"id": "crowded", "category": "realtime",
         "pipeline": {"transcriber": "whisper", "llm": "smol-big", "voice": "voice"}},
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
        await _talk(conn, question)
        done = await _until(conn, "response.done", seen)
        heard = list(seen)


    kinds = [event.type for event in heard]
    assert "error" not in kinds, [e for e in heard if e.type == "error"]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "conversation.item.added", "response.created",
             "conversation.item.input_audio_transcription.completed", "conversation.item.done",
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
                                 ("mute", 503, "pipeline.voice: 'whisper' is a stt model"),
                                 # which is named depends on what is loaded already
                                 ("crowded", 503, "cannot be on the GPUs together: '")]:
        with pytest.raises(websocket_errors.InvalidStatus) as refused:
            async with client.realtime.connect(model=model):
                pass
        response = refused.value.response
        assert response.status_code == status
        assert words in response.body.decode()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        listed = (await http.get("/v1/models/mute")).json()
    assert "pipeline.voice" in (listed.get("unavailable_reason") or "")


async def _talk(conn, pcm: bytes) -> None:
    """``pcm`` sent in real time, as a microphone sends it: 20 ms a chunk."""
    for at in range(0, len(pcm), CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[at:at + CHUNK]).decode())
        await asyncio.sleep(0.02)


def _onset_ms(pcm: bytes) -> int:
    """Where the first loud sample of ``pcm`` (PCM16 at 24 kHz) is, in ms."""
    samples = memoryview(pcm).cast("h")
    first = next(i for i, sample in enumerate(samples) if abs(sample) > 1000)
    return first * 1000 // 24000


def _ledger(server: ServerProcess, prefix: str) -> list[dict]:
    [path] = server.workdir.rglob("usage.sqlite3")
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(
            "SELECT * FROM usage WHERE request_id LIKE ? ORDER BY at", (prefix + "%",))]


async def _status(server: ServerProcess) -> dict:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        return (await http.get("/api/v1/status")).json()


async def test_speech_while_an_answer_plays_cancels_it_within_half_a_second(server):
    """The half second from the speech's first sound to the answer's end: on the audio's own
    clock up to the frame silero-vad first hears as voice (the server's work to hear it), then
    on the wall clock from ``speech_started`` to the cancelled ``response.done`` (the server's
    work to stop the answer). How far the server's hearing lags the sender on a busy box is
    the benchmark's (benchmarks/realtime_latency.py), not this test's."""
    lead = silence(0.5)  # past the 300 ms prefix padding: the start shows the voiced frame
    question = lead + spoken("Tell me about cats.") + silence(0.8)
    async with _client(server).realtime.connect(model="talk") as conn:
        seen: list = []
        await _until(conn, "session.created", seen)
        await conn.session.update(session={
            "type": "realtime", "max_output_tokens": "inf",  # a story: still told when cut
            "instructions": "Tell a long story, in many sentences.",
            "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": 400,
                                                   "prefix_padding_ms": 300}}}})
        await _until(conn, "session.updated", seen)
        status = await _status(server)
        [session] = status["realtime_sessions"]
        assert session["model"] == "talk" and sorted(session["models"]) == \
            ["smol", "voice", "whisper"]
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Tell me a long story about a cat."}]})
        await conn.response.create()
        seen.clear()
        await _until(conn, "response.output_audio.delta", seen)
        # the next answer is short (the story's own length was fixed as it began)
        await conn.session.update(session={
            "type": "realtime", "max_output_tokens": 16,
            "instructions": "Answer in one short sentence."})
        talker = asyncio.create_task(_talk(conn, question))
        try:
            started = await _until(conn, "input_audio_buffer.speech_started", seen)
            heard_at = time.monotonic()
            cancelled = await _until(conn, "response.done", seen)
            stop_ms = (time.monotonic() - heard_at) * 1000
            answered = await _until(conn, "response.done", seen)  # the second question's
        finally:
            await talker
    assert cancelled.response.status == "cancelled", cancelled.response.status
    hear_ms = started.audio_start_ms + 300 - _onset_ms(question)
    assert 0 <= hear_ms and hear_ms + stop_ms <= 500, (hear_ms, stop_ms)
    kinds = [event.type for event in seen]
    done_at = kinds.index("response.done")
    assert kinds.index("input_audio_buffer.speech_started") < done_at
    first_id = cancelled.response.id
    assert not [e for e in seen[done_at:] if e.type == "response.output_audio.delta"
                and e.response_id == first_id]  # nothing of it after the cancel
    assert answered.response.status == "completed"

    # each call of the second turn is a ledger row under its response's id
    rows = []
    for _ in range(50):
        rows = _ledger(server, answered.response.id + "/")
        if any(row["request_id"].endswith("/answer") for row in rows):
            break
        await asyncio.sleep(0.2)
    calls = {row["request_id"].rsplit("/", 1)[-1]: row for row in rows}
    assert calls["heard"]["endpoint"] == "/v1/audio/transcriptions"
    assert calls["heard"]["audio_seconds"] >= 1  # whole seconds, as OpenAI's usage counts
    assert calls["answer"]["completion_tokens"] == answered.response.usage.output_tokens
    said = [row for name, row in calls.items() if name.startswith("said-")]
    assert said and all(row["endpoint"] == "/v1/audio/speech" for row in said)
    assert all(row["gpu_seconds"] > 0 and row["outcome"] == "ok" for row in rows), rows

    # the session is over: nothing holds the models, nothing runs on them
    for _ in range(50):
        status = await _status(server)
        if not status["realtime_sessions"]:
            break
        await asyncio.sleep(0.1)
    assert status["realtime_sessions"] == []
    assert all(not slot["held_by"] and slot["active_requests"] == 0
               for slot in status["slots"]), status["slots"]


async def _story(conn, seen: list) -> None:
    """A long answer begun: its first audio is out."""
    await _until(conn, "session.created", seen)
    await conn.session.update(session={
        "type": "realtime", "max_output_tokens": "inf", "instructions": "Tell a long story.",
        "audio": {"input": {"turn_detection": None}}})
    await conn.conversation.item.create(item={
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Tell me a long story about a dog."}]})
    await conn.response.create()
    await _until(conn, "response.output_audio.delta", seen)


async def _settled(server: ServerProcess) -> dict:
    """The status once no session is open and nothing runs (10 s at most)."""
    for _ in range(100):
        status = await _status(server)
        if not status["realtime_sessions"] and not any(
                slot["active_requests"] or slot["held_by"] for slot in status["slots"]):
            return status
        await asyncio.sleep(0.1)
    return status


async def test_a_client_gone_mid_answer_leaves_nothing_running_or_held(server):
    async with _client(server).realtime.connect(model="talk") as conn:
        await _story(conn, [])
    status = await _settled(server)
    assert status["realtime_sessions"] == []
    assert all(slot["active_requests"] == 0 and slot["held_by"] == [] and slot["state"] in
               ("ready", "idle") for slot in status["slots"]), status["slots"]
    assert status["queue"]["depth"] == 0


async def test_a_chat_worker_killed_mid_answer_fails_the_answer_and_the_next_one_is_served(
        server):
    async with _client(server).realtime.connect(model="talk") as conn:
        seen: list = []
        await _story(conn, seen)
        [llm] = [slot for slot in (await _status(server))["slots"] if slot["model"] == "smol"]
        os.kill(llm["pid"], signal.SIGKILL)
        failed = await _until(conn, "response.done", seen)
        assert failed.response.status == "failed"
        assert any(event.type == "error" for event in seen)
        # the socket is still open: the next answer loads the chat model again
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 16,
                                           "instructions": "Answer in one short sentence."})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Say hello."}]})
        await conn.response.create()
        again = await _until(conn, "response.done", seen)
        assert again.response.status == "completed", [e for e in seen if e.type == "error"]
        [llm_again] = [slot for slot in (await _status(server))["slots"]
                       if slot["model"] == "smol"]
        assert llm_again["pid"] != llm["pid"] and llm_again["held_by"]
    status = await _settled(server)
    assert all(slot["active_requests"] == 0 and not slot["held_by"]
               for slot in status["slots"]), status["slots"]


async def test_a_stopping_daemon_ends_the_session_and_frees_everything(server):
    """Last in the file: it stops the module's daemon."""
    async with _client(server).realtime.connect(model="talk") as conn:
        seen: list = []
        await _story(conn, seen)
        workers = [slot["pid"] for slot in (await _status(server))["slots"] if slot["pid"]]
        assert workers
        stopping = asyncio.create_task(asyncio.to_thread(server.stop))
        ended = await _until(conn, "error", seen)
        assert ended.error.code == "session_ended"
        with pytest.raises(websocket_errors.ConnectionClosed):
            async with asyncio.timeout(30):
                while True:  # the server closes the socket after saying why
                    await conn.recv()
        assert await stopping == 0
    kinds = [event.type for event in seen]
    done = seen[kinds.index("response.done")]
    assert done.response.status == "cancelled"
    for pid in workers:  # no orphan: every worker went with the daemon
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
