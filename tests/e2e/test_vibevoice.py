"""A VibeVoice as a voice: a tiny random-weight VibeVoice (tests/transformers_fixtures.py) put
under ``models_dir`` is found by its config, listed with the voices of its ``voices/`` folder
and served on ``/v1/audio/speech`` by the transformers worker, through the official client,
whole and streamed; voices are added, listed and deleted live through ``/api/v1/voices``.
Random weights say nothing about how it sounds: the checks are the audio's format, its
repeatability under one seed, and that another voice changes it."""

from __future__ import annotations

import importlib.util
import io
import wave

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.lazy_modules import lazy
from tests.transformers_fixtures import build_vibevoice, shared, speech_clip, tone_clip

openai = lazy("openai")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                                 or importlib.util.find_spec("av") is None,
                                 reason="the 'transformers' extra")]

MODEL = "tiny-vibevoice"
TWO_SPEAKERS = "Speaker 1: Hello there.\nSpeaker 2: Hi, how are you?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models_dir = tmp_path_factory.mktemp("vibevoice-models")
    (models_dir / MODEL).symlink_to(shared(tmp_path_factory, "vibevoice", build_vibevoice))
    srv = ServerProcess(tmp_path_factory.mktemp("vibevoice"),
                        {"models_dir": str(models_dir), "discover": True,
                         "gpus": [{"index": 0, "name": "sim", "vram_mb": 4000}]}, [])
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                         timeout=120)


def speak(client, voice: str, text: str = "Hello there.", **extra) -> bytes:
    return client.audio.speech.create(model=MODEL, voice=voice, input=text,
                                      response_format=extra.pop("response_format", "wav"),
                                      extra_body={"seed": 7, **extra}).read()


def silence(seconds: float, rate: int = 24000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(bytes(2 * int(seconds * rate)))
    return out.getvalue()


def test_the_folder_is_a_voice_model_listing_its_voices(server):
    card = httpx.get(f"{server.url}/v1/models/{MODEL}").json()
    assert card["category"] == "tts" and card["backend"] == "transformers"
    assert card["voices"] == ["alice", "bob"]


def test_a_folder_voice_speaks_the_same_under_one_seed_and_differently_in_another(client):
    alice = speak(client, "alice")
    with wave.open(io.BytesIO(alice)) as audio:
        assert audio.getframerate() == 24000 and audio.getnframes() > 0
    assert speak(client, "alice") == alice
    assert speak(client, "bob") != alice
    assert speak(client, "alice", seed=8) != alice


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_response_format(client, fmt):
    assert len(speak(client, "alice", response_format=fmt)) > 100


def test_streamed_as_generated_equals_the_whole(client):
    whole = speak(client, "alice", response_format="mp3")
    with client.audio.speech.with_streaming_response.create(
            model=MODEL, voice="alice", input="Hello there.", response_format="mp3",
            extra_body={"seed": 7}) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        chunks = list(response.iter_bytes(256))
    assert len(chunks) > 1 and b"".join(chunks) == whole


def test_two_speakers_in_one_script(client):
    both = speak(client, "alice", TWO_SPEAKERS, voices=["alice", "bob"])
    assert both != speak(client, "alice", TWO_SPEAKERS, voices=["bob", "alice"])
    assert speak(client, "alice", TWO_SPEAKERS, voices=["alice", "bob"]) == both


def test_a_voice_added_live_is_listed_used_and_deleted(server, client):
    url = f"{server.url}/api/v1/voices"
    added = httpx.post(url, data={"model": MODEL, "name": "carol"},
                       files={"file": ("carol.mp3", speech_clip(2, "mp3"))})
    assert added.status_code == 201, added.text
    assert added.json()["source"] == "added" and 1.9 < added.json()["seconds"] < 2.2
    names = [v["name"] for v in httpx.get(url, params={"model": MODEL}).json()["data"]]
    assert names == ["alice", "bob", "carol"]
    assert httpx.get(f"{server.url}/v1/models/{MODEL}").json()["voices"][-1] == "carol"
    carol = speak(client, "carol")
    assert carol != speak(client, "alice") and speak(client, "carol") == carol
    assert speak(client, "alice", TWO_SPEAKERS, voices=["carol", "bob"])
    taken = httpx.post(url, data={"model": MODEL, "name": "carol"},
                       files={"file": ("c.wav", tone_clip(1, 500))})
    assert taken.status_code == 409 and taken.json()["error"]["param"] == "name"
    assert httpx.delete(f"{url}/carol").json()["deleted"] is True
    assert httpx.delete(f"{url}/carol").status_code == 404
    with pytest.raises(openai.BadRequestError) as gone:
        speak(client, "carol")
    assert gone.value.body["param"] == "voice"


@pytest.mark.parametrize(("form", "file", "status", "param"), [
    ({"model": MODEL, "name": "noise"}, ("x.wav", b"not audio at all"), 400, "file"),
    ({"model": MODEL, "name": "hush"}, ("x.wav", silence(1)), 400, "file"),
    ({"model": MODEL, "name": "long"}, ("x.flac", speech_clip(61, "flac")), 400, "file"),
    ({"model": MODEL, "name": "blip"}, ("x.wav", tone_clip(0.2, 300)), 400, "file"),
    ({"model": MODEL, "name": "bad name!"}, ("x.wav", tone_clip(1, 300)), 400, "name"),
    ({"model": MODEL, "name": "alice"}, ("x.wav", tone_clip(1, 300)), 409, "name"),
    ({"model": "nope", "name": "x"}, ("x.wav", tone_clip(1, 300)), 404, "model"),
    ({"name": "x"}, ("x.wav", tone_clip(1, 300)), 400, "model"),
    ({"model": MODEL, "name": "x"}, None, 400, "file"),
])
def test_a_voice_the_model_cannot_take_is_refused_naming_the_field(server, form, file,
                                                                  status, param):
    answer = httpx.post(f"{server.url}/api/v1/voices", data=form,
                        files={"file": file} if file else {"other": ("o.txt", b"x")},
                        timeout=60)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize(("body", "param"), [
    ({"voice": "nobody", "input": "Hi."}, "voice"),
    ({"voice": "alice", "input": TWO_SPEAKERS}, "voice"),  # two speakers, one voice
    ({"voice": "alice", "input": TWO_SPEAKERS, "voices": ["alice"]}, "voices"),
    ({"voice": "alice", "input": TWO_SPEAKERS, "voices": ["alice", "nobody"]}, "voices"),
    ({"voice": "alice", "input": "Speaker 1: Hi.\nno speaker here"}, "input"),
    ({"voice": "alice", "input": "Speaker 1: Hi.\nSpeaker 3: Hi."}, "input"),
    ({"voice": "alice", "input": "Hi.", "voices": []}, "voices"),
    ({"voice": "alice", "input": "Hi.", "seed": -1}, "seed"),
    ({"voice": "alice", "input": "Hi.", "speed": 2.0}, "speed"),
])
def test_bad_voices_and_scripts_are_400s_naming_the_field(server, body, param):
    answer = httpx.post(f"{server.url}/v1/audio/speech", timeout=60,
                        json={"model": MODEL, **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
