"""Speech under the coordinator: a tiny random-weight Wav2Vec2 recogniser, a Whisper recogniser
and a VITS voice (built with save_pretrained) served by the transformers worker through the
official OpenAI client, their audio decoded and encoded by PyAV; switched through the CPU tier
on one small declared GPU; bad uploads answered with 4xx envelopes. Random weights say nothing
meaningful, so answers are checked for shape, type and format."""

from __future__ import annotations

import io
import wave

import av
import httpx
import openai
import pytest

from tests.conftest import ServerProcess, wait_for
from tests.transformers_fixtures import (
    CLIP_FORMATS,
    build_embedder,
    build_recogniser,
    build_voice,
    build_whisper,
    shared,
    speech_clip,
)

pytestmark = pytest.mark.slow

pytest.importorskip("transformers", reason="the 'transformers' extra")

UPLOAD_LIMIT = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    manifests = [
        {"id": "ears", "backend": "transformers", "category": "stt",
         "path": str(shared(tmp_path_factory, "recogniser", build_recogniser)),
         "vram_mb": 1000},
        {"id": "whisper", "backend": "transformers", "category": "stt",
         "path": str(shared(tmp_path_factory, "whisper", build_whisper)), "vram_mb": 1000},
        {"id": "voice", "backend": "transformers", "category": "tts",
         "path": str(shared(tmp_path_factory, "voice", build_voice)), "vram_mb": 1000},
        {"id": "embed", "backend": "transformers", "category": "embedding",
         "path": str(shared(tmp_path_factory, "embedder", build_embedder)), "vram_mb": 1000},
    ]
    # room for one model at a time: every switch goes through the CPU-RAM tier
    srv = ServerProcess(tmp_path_factory.mktemp("speech"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 1600}],
                         "vram_margin_mb": 100, "max_upload_bytes": UPLOAD_LIMIT}, manifests)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def slot(server: ServerProcess, model: str) -> dict:
    return next(s for s in server.status()["slots"] if s["model"] == model)


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
    sentences = " ".join(f"Sentence number {n} is here." for n in range(6))
    with client.audio.speech.with_streaming_response.create(
            model="voice", voice="alloy", input=sentences, response_format="mp3",
            speed=1.2) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        assert response.headers.get("transfer-encoding") == "chunked"
        chunks = [chunk for chunk in response.iter_bytes() if chunk]
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
])
def test_an_endpoint_the_models_kind_does_not_serve_is_a_400(server, path, body, files):
    if files:
        answer = httpx.post(server.url + path, timeout=60, data=body,
                            files={"file": ("a.wav", speech_clip(1))})
    else:
        answer = httpx.post(server.url + path, timeout=60, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "unsupported_endpoint"


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": "hi", "speed": 9}, "speed"),
    ({"input": "hi", "response_format": "ogg"}, "response_format"),
])
def test_bad_speech_requests_are_400s(server, body, param):
    answer = httpx.post(server.url + "/v1/audio/speech", timeout=60,
                        json={"model": "voice", **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_an_unknown_speech_model_is_a_404(server, client):
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="nope", file=("a.wav", speech_clip(1)))
