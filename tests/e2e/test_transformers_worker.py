"""The transformers worker under the coordinator: a tiny random-weight embedder, reranker,
Wav2Vec2 recogniser, Whisper recogniser and VITS voice (built with save_pretrained) beside the
demo LLM on one small declared GPU: served through the official clients (their audio decoded
and encoded by PyAV), embeddings batched, every switch through the CPU tier, and bad input
(bad uploads too) answered with 4xx envelopes. Random weights say nothing meaningful, so
answers are checked for shape, type and format."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import io
import os
import signal
import struct
import time
import warnings
import wave

import httpx
import psutil
import pytest

from tests.conftest import (
    ServerProcess,
    llama_manifest,
    wait_for,
    worker_health,
    worker_secret,
)
from tests.lazy_modules import lazy
from tests.transformers_fixtures import (
    CLIP_FORMATS,
    build_embedder,
    build_recogniser,
    build_reranker,
    build_voice,
    build_whisper,
    shared,
    speech_clip,
)

av = lazy("av")
ollama = lazy("ollama")
openai = lazy("openai")

# looked for, not imported: both test processes collect every file, and importing
# sentence-transformers (torch, transformers, scikit-learn) costs each of them seconds
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                                 reason="the 'transformers' extra")]

UPLOAD_LIMIT = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    embedder = shared(tmp_path_factory, "embedder", build_embedder)
    reranker = shared(tmp_path_factory, "reranker", build_reranker)
    manifests = [
        {"id": "embed", "backend": "transformers", "category": "embedding",
         "path": str(embedder), "vram_mb": 1000, "max_batch_wait_ms": 20},
        {"id": "rerank", "backend": "transformers", "category": "rerank",
         "path": str(reranker), "vram_mb": 1000},
        {"id": "ears", "backend": "transformers", "category": "stt",
         "path": str(shared(tmp_path_factory, "recogniser", build_recogniser)),
         "vram_mb": 1000},
        {"id": "whisper", "backend": "transformers", "category": "stt",
         "path": str(shared(tmp_path_factory, "whisper", build_whisper)), "vram_mb": 1000},
        {"id": "voice", "backend": "transformers", "category": "tts",
         "path": str(shared(tmp_path_factory, "voice", build_voice)), "vram_mb": 1000},
        llama_manifest("smol", demo_gguf, vram_mb=1000),
    ]
    # room for one model at a time: every switch goes through the CPU-RAM tier
    srv = ServerProcess(tmp_path_factory.mktemp("transformers"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 1600}],
                         "vram_margin_mb": 100, "max_upload_bytes": UPLOAD_LIMIT}, manifests)
    srv.start()
    yield srv
    srv.stop()


def slot(server: ServerProcess, model: str) -> dict:
    return next(s for s in server.status()["slots"] if s["model"] == model)


def test_the_openai_client_embeds(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    one = client.embeddings.create(model="embed", input="the cat sat on the mat")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 32
    assert one.usage.prompt_tokens > 2 and one.model == "embed"
    many = client.embeddings.create(model="embed", input=["a cat", "a dog", "paris"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.data[0].embedding != many.data[1].embedding
    short = client.embeddings.create(model="embed", input="a cat", dimensions=8)
    vector = short.data[0].embedding
    assert len(vector) == 8 and abs(sum(x * x for x in vector) - 1) < 1e-4
    raw = httpx.post(server.url + "/v1/embeddings", timeout=60, json={
        "model": "embed", "input": "a cat", "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert len(packed) == 32 * 4
    floats = struct.unpack("<32f", packed)
    assert floats == pytest.approx(many.data[0].embedding, abs=1e-5)


def test_a_loaded_model_reports_its_size(server):
    """The worker's weights are measured at load (on a GPU: CUDA's own figures) and the slot
    shows it; a declared GPU keeps the manifest's figure for its lease."""
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=120).raise_for_status()
    embed = slot(server, "embed")
    health = worker_health(embed)
    assert health["footprint_mb"] >= 1 and health["load_s"] > 0
    assert health["loads_from_disk"] == 1 and health["model"].endswith("shared-embedder")
    assert embed["measured_mb"] == health["footprint_mb"]


def test_ollamas_client_embeds(server):
    client = ollama.Client(host=server.url)
    answer = client.embed(model="embed", input=["hello world", "the sun rose"])
    assert len(answer.embeddings) == 2 and len(answer.embeddings[0]) == 32


def test_rerank_orders_documents_by_score(server):
    docs = ["paris is the capital of france", {"text": "the cat sat on the mat"},
            "the river is blue", "a big red dog"]
    answer = httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "rerank", "query": "what is the capital of france", "documents": docs})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert body["model"] == "rerank" and body["usage"]["total_tokens"] > 0
    top = httpx.post(server.url + "/rerank", timeout=60, json={
        "model": "rerank", "query": "capital", "documents": docs, "top_n": 2,
        "return_documents": True}).json()["results"]
    assert len(top) == 2
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    assert all(r["document"]["text"] == texts[r["index"]] for r in top)


def test_switches_go_through_the_cpu_tier(server):
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    pid = slot(server, "embed")["pid"]
    httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "rerank", "query": "q", "documents": ["d"]}).raise_for_status()
    parked = slot(server, "embed")
    assert parked["state"] == "offloaded" and parked["tier"] == "cpu" and parked["lease"] is None
    assert worker_health(parked)["state"] == "offloaded"
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    back = slot(server, "embed")
    assert back["state"] == "ready" and back["pid"] == pid  # onloaded, not loaded from disk
    assert slot(server, "rerank")["tier"] == "cpu"


def test_concurrent_single_sentences_are_batched(server):
    """32 requests at once go to the worker gathered and run batched; each gets its own
    answer, and the one the worker refuses its own 400, in the same burst."""
    def body(i: int) -> dict:
        return {"model": "embed", "input": f"sentence {i}", **({"dimensions": 4096}
                                                               if i == 7 else {})}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(server.url + "/v1/embeddings",
                                                      json=body(i)) for i in range(32)))

    answers = asyncio.run(burst())
    assert answers[7].status_code == 400, answers[7].text
    assert "dimensions" in answers[7].json()["error"]["message"]
    good = [a for i, a in enumerate(answers) if i != 7]
    assert all(a.status_code == 200 for a in good), [a.text for a in good][:3]
    vectors = [a.json()["data"][0]["embedding"] for a in good]
    assert len({tuple(v) for v in vectors}) == len(good)  # each its own sentence's
    alone = httpx.post(server.url + "/v1/embeddings", json=body(3), timeout=60).json()
    assert alone["data"][0]["embedding"] == pytest.approx(vectors[3], abs=1e-5)
    health = worker_health(slot(server, "embed"))
    assert health["largest_batch"] > 1, health


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": "not a list"}, "documents"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"model": "rerank", "query": "", "documents": ["d"]}, "query"),
    ("/v1/rerank", {"model": "embed", "query": "q", "documents": ["d"]}, "/v1/embeddings"),
    ("/v1/embeddings", {"model": "rerank", "input": "x"}, "/v1/rerank"),
    ("/v1/embeddings", {"model": "embed", "input": [[1, 2, 3]]}, "token arrays"),
    ("/v1/embeddings", {"model": "embed", "input": ["ok", ""]}, "empty"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "dimensions": 4096}, "dimensions"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": "hex"},
     "encoding_format"),
    ("/v1/chat/completions", {"model": "embed", "messages": [{"role": "user",
                                                              "content": "hi"}]}, "embed"),
])
def test_bad_input_is_a_4xx_in_the_openai_envelope(server, path, body, words):
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]
    assert words in error["message"] and set(error) >= {"message", "type", "code"}, error
    wait_for(lambda: all(s["state"] in ("idle", "ready", "offloaded")
                         for s in server.status()["slots"]), timeout=30)


def test_unknown_model_and_a_killed_worker(server):
    missing = httpx.post(server.url + "/v1/rerank", timeout=30, json={
        "model": "nope", "query": "q", "documents": ["d"]})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    pid = slot(server, "embed")["pid"]
    os.kill(pid, signal.SIGKILL)
    # the crash is noticed (the slot leaves READY, its lease goes) and the next request
    # loads a new worker
    wait_for(lambda: slot(server, "embed")["state"] != "ready", timeout=15,
             what=lambda: slot(server, "embed"))
    again = httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
                       timeout=60)
    assert again.status_code == 200, again.text
    assert slot(server, "embed")["pid"] not in (None, pid)


# --- speech ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def upload(server: ServerProcess, data: bytes, path: str = "/v1/audio/transcriptions",
           name: str = "clip.wav", **fields) -> httpx.Response:
    return httpx.post(server.url + path, timeout=120, files={"file": (name, data)},
                      data={"model": "ears", **fields})


@pytest.mark.parametrize("kind", sorted(CLIP_FORMATS))
def test_every_common_audio_file_is_transcribed(server, client, kind):
    text = client.audio.transcriptions.create(
        model="ears", file=(f"clip.{kind}", speech_clip(2, kind)))
    assert isinstance(text.text, str) and text.text  # random weights: some letters


def test_transcripts_in_every_response_format(server, client):
    clip = ("clip.mp3", speech_clip(6, "mp3"))
    plain = client.audio.transcriptions.create(model="ears", file=clip, response_format="text")
    assert isinstance(plain, str) and plain.strip()
    srt = client.audio.transcriptions.create(model="ears", file=clip, response_format="srt")
    first = srt.strip().split("\n\n")[0].splitlines()
    assert first[0] == "1" and " --> " in first[1] and first[1].count(",") == 2
    vtt = client.audio.transcriptions.create(model="ears", file=clip, response_format="vtt")
    assert vtt.startswith("WEBVTT") and " --> " in vtt
    verbose = client.audio.transcriptions.create(
        model="ears", file=clip, response_format="verbose_json",
        timestamp_granularities=["word", "segment"])
    assert verbose.duration == pytest.approx(6, abs=0.1) and verbose.language == "english"
    assert verbose.segments and verbose.words
    ends = [s.end for s in verbose.segments]
    assert ends == sorted(ends) and ends[-1] <= verbose.duration + 0.05
    assert all(w.start <= w.end for w in verbose.words)


def test_long_audio_is_transcribed_in_chunks(server, client):
    verbose = client.audio.transcriptions.create(
        model="ears", file=("long.flac", speech_clip(70, "flac")),
        response_format="verbose_json", timestamp_granularities=["word"])
    assert verbose.duration == pytest.approx(70, abs=0.1)
    assert verbose.words[-1].end > 60  # the last chunk was heard too


def test_whisper_transcribes_and_translates(server, client):
    clip = ("clip.wav", speech_clip(3, "wav"))
    heard = client.audio.transcriptions.create(
        model="whisper", file=clip, language="fr", prompt="bonjour", temperature=0.2,
        response_format="verbose_json")
    assert heard.language == "french" and heard.duration == pytest.approx(3, abs=0.1)
    assert all(0 <= s.start <= s.end <= 3.01 for s in heard.segments)
    with warnings.catch_warnings():  # the openai client marks its translations call deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        english = client.audio.translations.create(model="whisper", file=clip,
                                                   response_format="verbose_json")
    assert english.language == "english" and english.task == "translate"


def _mp3_frames(data: bytes) -> int:
    """MPEG audio frame headers (11 sync bits) after any ID3 tag."""
    if data[:3] == b"ID3":
        size = (data[6] << 21) | (data[7] << 14) | (data[8] << 7) | data[9]
        data = data[10 + size:]
    return sum(1 for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] & 0xE0 == 0xE0)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_speech_in_every_format(server, client, fmt):
    answer = client.audio.speech.create(model="voice", voice="alloy", response_format=fmt,
                                        input="Hello there. The cat sat on the mat!")
    data = answer.content
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as parsed:
            assert parsed.getframerate() == 16000 and parsed.getnchannels() == 1
            assert parsed.getnframes() > 0
    elif fmt == "pcm":
        assert len(data) > 0 and len(data) % 2 == 0
    else:
        if fmt == "mp3":
            assert _mp3_frames(data) > 0
        magic = {"opus": b"OggS", "flac": b"fLaC"}.get(fmt)
        assert magic is None or data.startswith(magic)
        with av.open(io.BytesIO(data)) as parsed:  # it decodes
            assert sum(f.samples for f in parsed.decode(audio=0)) > 0
    assert answer.response.headers["x-model-boss-model"] == "voice"


def test_speech_streams_sentence_by_sentence_and_is_heard_again(server, client):
    """Each sentence is sent as soon as it is synthesised: several chunks arrive over time,
    the first long before the last (an answer synthesised whole would arrive at once)."""
    sentences = " ".join(f"Sentence number {n} is here." for n in range(12))
    client.audio.speech.create(model="voice", voice="alloy", input="Hi.",
                               response_format="wav")  # loaded: the stream times synthesis
    arrivals: list[tuple[float, int]] = []  # (seconds since the request, bytes)
    started = time.monotonic()
    with client.audio.speech.with_streaming_response.create(
            model="voice", voice="alloy", input=sentences, response_format="mp3",
            speed=1.2) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        assert response.headers.get("transfer-encoding") == "chunked"
        chunks = []
        for chunk in response.iter_bytes():
            if chunk:
                arrivals.append((round(time.monotonic() - started, 3), len(chunk)))
                chunks.append(chunk)
    first, last = arrivals[0][0], arrivals[-1][0]
    assert len({at for at, _ in arrivals}) >= 3, arrivals  # several, at different times
    assert first < last / 2, arrivals  # the first before most sentences were synthesised
    audio = b"".join(chunks)
    assert _mp3_frames(audio) > 0
    heard = client.audio.transcriptions.create(model="ears", file=("speech.mp3", audio))
    assert isinstance(heard.text, str)


def test_switching_models_goes_through_the_cpu_tier(server, client):
    client.audio.speech.create(model="voice", voice="alloy", input="one", response_format="wav")
    client.audio.transcriptions.create(model="ears", file=("a.wav", speech_clip(1)))
    wait_for(lambda: slot(server, "voice")["state"] == "offloaded", timeout=30,
             what=lambda: slot(server, "voice"))
    client.audio.speech.create(model="voice", voice="alloy", input="two", response_format="wav")
    voice = slot(server, "voice")
    assert voice["state"] == "ready" and voice["loads"] == 1  # onloaded, not loaded again
    assert slot(server, "ears")["state"] == "offloaded"


@pytest.mark.parametrize("data, name, code", [
    (b"", "empty.wav", "invalid_value"),
    (b"this is a text file, not a recording\n" * 40, "notes.txt", "invalid_audio"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt garbage" * 8, "broken.wav", "invalid_audio"),
])
def test_a_file_that_is_no_audio_is_a_400(server, data, name, code):
    answer = upload(server, data, name=name)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and error["param"] == "file"
    assert "/" not in error["message"]  # no path of the worker's


@pytest.mark.parametrize("kwargs, param", [
    ({"files": None, "data": {"model": "ears"}}, None),
    ({"json": {"model": "ears", "file": "abc"}}, None),
    ({"data": {"model": "ears", "response_format": "mp4"}}, "response_format"),
    ({"data": {"model": "ears", "temperature": "hot"}}, "temperature"),
    ({"data": {"model": "ears", "temperature": "3"}}, "temperature"),
])
def test_bad_forms_are_400s_naming_the_field(server, kwargs, param):
    if "json" not in kwargs and kwargs.get("files", 1) is not None:
        kwargs["files"] = {"file": ("a.wav", speech_clip(1))}
    answer = httpx.post(server.url + "/v1/audio/transcriptions", timeout=60,
                        **{k: v for k, v in kwargs.items() if v is not None})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    else:
        assert "file" in error["message"] or "multipart" in error["message"]


def test_an_upload_over_the_limit_is_a_413(server):
    answer = upload(server, b"\0" * (UPLOAD_LIMIT + 1024))
    assert answer.status_code == 413
    assert str(UPLOAD_LIMIT) in answer.json()["error"]["message"]


@pytest.mark.parametrize("path, body, files", [
    ("/v1/audio/speech", {"model": "ears", "input": "hi"}, None),
    ("/v1/audio/speech", {"model": "embed", "input": "hi"}, None),
    ("/v1/embeddings", {"model": "voice", "input": "hi"}, None),
    ("/v1/audio/transcriptions", {"model": "voice"}, True),
    ("/v1/audio/translations", {"model": "ears"}, True),  # CTC models do not translate
    ("/v1/audio/speech", {"model": "smol", "input": "hi"}, None),  # llama.cpp: no audio
    ("/v1/audio/transcriptions", {"model": "smol"}, True),
])
def test_an_endpoint_the_models_kind_does_not_serve_is_a_400(server, path, body, files):
    if files:
        answer = httpx.post(server.url + path, timeout=60, data=body,
                            files={"file": ("a.wav", speech_clip(1))})
    else:
        answer = httpx.post(server.url + path, timeout=60, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "unsupported_endpoint"


@pytest.mark.parametrize("path, body, field, others", [
    ("/v1/embeddings", {"model": "smol", "input": "hi"}, "embeddings", "embed"),
    ("/api/embed", {"model": "smol", "input": "hi"}, "embeddings", "embed"),
    ("/v1/rerank", {"model": "smol", "query": "q", "documents": ["a"]}, "reranking", "rerank"),
])
def test_a_chat_model_asked_for_embeddings_names_the_field_and_the_models_that_do(
        server, path, body, field, others):
    """Advice a user can follow: the manifest field, not llama.cpp's ``--embeddings`` flag,
    and which models do serve it; refused before the chat model is loaded for it."""
    def loads() -> int:
        return sum(s["loads"] for s in server.status()["slots"] if s["model"] == "smol")

    before = loads()
    answer = httpx.post(server.url + path, timeout=60, json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    message = error if isinstance(error, str) else error["message"]  # Ollama's: a string
    assert f"set `{field}: true` in its manifest" in message and "--" not in message
    assert message.endswith(f"models that do: {others}")
    assert loads() == before


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": "hi", "speed": 9}, "speed"),
    ({"input": "hi", "response_format": "ogg"}, "response_format"),
    # reference voices for a script's speakers: a voice-cloning model's, not a VITS voice's
    ({"input": "Speaker 1: hi", "voices": ["alice"]}, "voices"),
])
def test_bad_speech_requests_are_400s(server, body, param):
    answer = httpx.post(server.url + "/v1/audio/speech", timeout=60,
                        json={"model": "voice", **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_an_unknown_speech_model_is_a_404(server, client):
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="nope", file=("a.wav", speech_clip(1)))


def test_five_kinds_share_one_gpu_through_the_official_clients(server, client):
    """An embedder, a reranker, a recogniser, a voice and the demo LLM, in turn, on a GPU
    that holds one of them: each answers through its client, the transformers models are
    parked in CPU RAM between turns, and one lease is held at the end."""
    for _ in range(2):
        assert len(client.embeddings.create(model="embed", input="a cat").data) == 1
        ranked = httpx.post(server.url + "/v1/rerank", timeout=120, json={
            "model": "rerank", "query": "a cat", "documents": ["a cat", "a dog"]})
        assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2
        heard = client.audio.transcriptions.create(model="ears",
                                                   file=("a.wav", speech_clip(1)))
        assert isinstance(heard.text, str)
        spoken = client.audio.speech.create(model="voice", voice="alloy", input="hi",
                                            response_format="wav")
        assert spoken.content[:4] == b"RIFF"
        chat = client.chat.completions.create(
            model="smol", max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
        assert chat.choices[0].message.content is not None
    slots = {s["model"]: s for s in server.status()["slots"]}
    assert slots["smol"]["state"] == "ready"
    assert all(slots[m]["state"] == "offloaded" and slots[m]["tier"] == "cpu"
               for m in ("embed", "rerank", "ears", "voice"))
    assert [lease["note"] for lease in httpx.get(
        server.url + "/api/v1/leases", timeout=10).json()["leases"]] == ["smol"]


# --- cancel, the CPU tier's refusal, load progress ------------------------------------------

def silent_flac(seconds: float, rate: int = 16000) -> bytes:
    """Half an hour of silence is a small FLAC file (well under the upload limit) and a long
    transcription: one chunk after another."""
    import numpy as np

    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as file:
        stream = file.add_stream("flac", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, int(seconds * rate)), dtype=np.int16),
                                           format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            file.mux(packet)
    return out.getvalue()


def events(server: ServerProcess, kind: str, since: int = 0) -> list[dict]:
    listed = httpx.get(f"{server.url}/api/v1/events?stream=false&since={since}",
                       timeout=10).json()["events"]
    return [e for e in listed if e["type"] == kind]


def last_seq(server: ServerProcess) -> int:
    listed = httpx.get(f"{server.url}/api/v1/events?stream=false", timeout=10).json()["events"]
    return listed[-1]["seq"] if listed else 0


def test_a_long_transcription_its_client_leaves_stops_on_the_worker(server, client):
    """The client goes mid-transcription: the coordinator sends the worker a cancel for that
    request id, the transcription stops at its next chunk (it would run for many seconds
    more), the worker's state and log say so, and the model is free for the next request."""
    client.audio.transcriptions.create(model="ears", file=("a.wav", speech_clip(1)))
    ears = slot(server, "ears")
    before = worker_health(ears)["cancelled"]
    clip = silent_flac(1800)  # 60 of the worker's 30 s chunks
    timed = time.monotonic()  # one chunk's time on this box now: what a stop may wait for
    client.audio.transcriptions.create(model="ears", file=("c.flac", silent_flac(30)))
    one_chunk_s = time.monotonic() - timed

    async def ask_then_leave() -> float:
        async with httpx.AsyncClient(timeout=120) as http:
            asking = asyncio.create_task(http.post(
                server.url + "/v1/audio/transcriptions", data={"model": "ears"},
                files={"file": ("long.flac", clip)}))
            await asyncio.to_thread(wait_for, lambda: worker_health(ears)["running"], 30)
            await asyncio.sleep(1.5)  # decoding it, or a few chunks in: either stops
            assert not asking.done()
            asking.cancel()  # the connection is closed: the client has gone
            with contextlib.suppress(asyncio.CancelledError):
                await asking
            return time.monotonic()

    left = asyncio.run(ask_then_leave())
    wait_for(lambda: not worker_health(ears)["running"], timeout=10,
             what=lambda: worker_health(ears))
    stopped_after = time.monotonic() - left
    health = worker_health(ears)
    assert health["cancelled"] == before + 1 and health["state"] == "ready", health
    # it stops at the next chunk: the whole clip would take some 60 chunks more
    assert stopped_after < 2.0 + 2 * one_chunk_s, (stopped_after, one_chunk_s)
    log = (server.workdir / "state" / "logs" / "ears.log").read_text()
    assert f"request {health['last_cancelled']} cancelled" in log
    started = time.monotonic()  # the model is free: the next request does not wait behind it
    client.audio.transcriptions.create(model="ears", file=("a.wav", speech_clip(1)))
    assert time.monotonic() - started < 5
    assert slot(server, "ears")["state"] == "ready"


def test_speech_its_reader_leaves_stops_before_the_next_sentence(server):
    text = " ".join(f"Sentence number {n} is here." for n in range(130))
    httpx.post(server.url + "/v1/audio/speech", timeout=120, json={
        "model": "voice", "input": "hi", "response_format": "wav"}).raise_for_status()
    voice = slot(server, "voice")
    before = worker_health(voice)["cancelled"]
    with httpx.stream("POST", server.url + "/v1/audio/speech", timeout=120, json={
            "model": "voice", "input": text, "response_format": "mp3"}) as response:
        assert response.status_code == 200
        assert next(response.iter_bytes())  # the first sentence, then the reader goes
    wait_for(lambda: not worker_health(voice)["running"], timeout=10,
             what=lambda: worker_health(voice))
    assert worker_health(voice)["cancelled"] == before + 1


def test_a_parked_model_is_refused_by_its_worker_and_onloaded_by_the_coordinator(
        server, client):
    """While its weights are in CPU RAM the worker refuses requests (409 model_offloaded, so
    one never runs on the CPU copy); through the coordinator the same request onloads the
    model first and the client sees no error."""
    client.embeddings.create(model="embed", input="x")
    httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "rerank", "query": "q", "documents": ["d"]}).raise_for_status()
    parked = wait_for(lambda: (s := slot(server, "embed"))["state"] == "offloaded" and s,
                      timeout=30, what=lambda: slot(server, "embed"))
    direct = httpx.post(f"http://127.0.0.1:{parked['port']}/v1/embeddings", timeout=30,
                        json={"input": "x"},
                        headers={"Authorization": f"Bearer {worker_secret(parked['pid'])}"})
    assert direct.status_code == 409, direct.text
    assert direct.json()["error"]["code"] == "model_offloaded"
    since = last_seq(server)
    answer = client.embeddings.create(model="embed", input="x")
    assert len(answer.data[0].embedding) == 32
    back = slot(server, "embed")
    assert back["state"] == "ready" and back["pid"] == parked["pid"]
    assert [e["model"] for e in events(server, "onloaded", since)].count("embed") == 1
    assert not [e for e in events(server, "load_started", since) if e["model"] == "embed"]


def test_a_transformers_load_reports_its_stages(server):
    """A cold load (from disk, after an unload) reported as ``load_progress`` events: every
    stage a transformers load has, in order, each once (its worker has no warm-up run of its
    own, so no "warming")."""
    httpx.post(server.url + "/api/v1/models/rerank/unload", timeout=60).raise_for_status()
    wait_for(lambda: all(s["state"] == "idle" for s in server.status()["slots"]
                         if s["model"] == "rerank"), timeout=30)  # no slot: never loaded
    since = last_seq(server)
    httpx.post(server.url + "/v1/rerank", timeout=120, json={
        "model": "rerank", "query": "q", "documents": ["d"]}).raise_for_status()
    stages = [e["stage"] for e in events(server, "load_progress", since)
              if e["model"] == "rerank"]
    assert stages == ["leasing", "starting", "loading", "ready"], stages


# last: it takes every transformers worker down with the template
def test_workers_are_forked_from_one_template_and_go_with_it(server):
    """Every transformers worker after the first is forked from the template (its parent),
    which did the imports once. A killed template takes the workers it forked with it: their
    slots leave READY and give their leases back, and the next request loads the model from a
    new template."""
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    [template] = server.status()["worker_templates"]
    assert template["module"] == "workers.transformers" and template["forks"] >= 2, template
    worker = slot(server, "embed")
    assert psutil.Process(worker["pid"]).ppid() == template["pid"]
    since = last_seq(server)
    os.kill(template["pid"], signal.SIGKILL)
    wait_for(lambda: (s := slot(server, "embed"))["state"] != "ready" and s["lease"] is None,
             timeout=15, what=lambda: slot(server, "embed"))
    crashed = [e for e in events(server, "worker_crashed", since) if e["model"] == "embed"]
    assert crashed, events(server, "worker_crashed", since)
    again = httpx.post(server.url + "/v1/embeddings", timeout=120,
                       json={"model": "embed", "input": "x"})
    assert again.status_code == 200, again.text
    [fresh] = server.status()["worker_templates"]
    assert fresh["pid"] != template["pid"]
    assert psutil.Process(slot(server, "embed")["pid"]).ppid() == fresh["pid"]
