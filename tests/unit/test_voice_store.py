"""The reference voices' store (catalog/voices.py): a model's folder voices and the ones
added live, kept in state_dir, and every recording the model cannot take refused naming
the field."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import wave

import numpy as np
import pytest

from model_boss.catalog.voices import VoiceStore, clones_voices, folder_voices
from model_boss.errors import BadRequest, Conflict, NotFound

needs_av = pytest.mark.skipif(importlib.util.find_spec("av") is None,
                              reason="PyAV (the 'transformers' extra) decodes recordings")


def recording(seconds: float, amplitude: float = 0.3, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes((amplitude * np.sin(2 * np.pi * 200 * t) * 32767)
                         .astype("<i2").tobytes())
    return out.getvalue()


def vibevoice_folder(folder, voice: str = "alice"):
    """A folder transformers' config calls VibeVoice, with one reference voice and a file
    that is none."""
    (folder / "voices").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "vibevoice"}))
    (folder / "voices" / f"{voice}.wav").write_bytes(recording(1))
    (folder / "voices" / "notes.txt").write_text("not a voice")
    return folder


@pytest.fixture
def model(tmp_path):
    return vibevoice_folder(tmp_path / "vv")


@pytest.mark.parametrize(("config", "clones"), [
    ({"model_type": "vibevoice"}, True),
    ({"model_type": "vits"}, False),
    ("not json", False),
    (None, False),
])
def test_which_models_take_voices(tmp_path, config, clones):
    if config is not None:
        (tmp_path / "config.json").write_text(
            config if isinstance(config, str) else json.dumps(config))
    assert clones_voices(tmp_path) is clones


def test_folder_voices_are_its_audio_files_by_name(model):
    assert [(v.name, v.source) for v in folder_voices("vv", model)] == [("alice", "folder")]
    assert folder_voices("vv", model.parent / "missing") == []


@needs_av
def test_an_added_voice_is_kept_listed_resolved_and_removed(tmp_path, model):
    store = VoiceStore(tmp_path / "state" / "voices")
    voice = store.add("org/vv", model, "bob", recording(2), "team-a")
    assert (voice.source, voice.added_by, voice.seconds) == ("added", "team-a", 2.0)
    assert [v.name for v in store.voices("org/vv", model)] == ["alice", "bob"]
    assert VoiceStore(tmp_path / "state" / "voices").added("org/vv")[0].added_by == "team-a"
    stored = base64.b64decode(store.recordings("org/vv", model, ["bob"], "voice")[0])
    with wave.open(io.BytesIO(stored)) as file:  # kept as decoded: 24 kHz mono
        assert (file.getframerate(), file.getnchannels()) == (24000, 1)
    store.remove("org/vv", "bob")
    assert [v.name for v in store.voices("org/vv", model)] == ["alice"]
    with pytest.raises(NotFound):
        store.remove("org/vv", "bob")


@needs_av
@pytest.mark.parametrize(("name", "data", "error", "param", "says"), [
    ("x", b"not audio", BadRequest, "file", "could not be decoded"),
    ("x", b"", BadRequest, "file", "empty"),
    ("x", recording(1, amplitude=0.0), BadRequest, "file", "silent"),
    ("x", recording(0.2), BadRequest, "file", "needs 0.5 s"),
    ("x", recording(61), BadRequest, "file", "at most 60 s"),
    ("bad name", recording(1), BadRequest, "name", "letters, digits"),
    ("../up", recording(1), BadRequest, "name", "letters, digits"),
    ("alice", recording(1), Conflict, "name", "in its folder"),
])
def test_a_recording_the_model_cannot_take_is_refused(tmp_path, model, name, data, error,
                                                     param, says):
    store = VoiceStore(tmp_path / "voices")
    with pytest.raises(error, match=says) as refused:
        store.add("vv", model, name, data, None)
    assert refused.value.param == param
    assert store.added("vv") == []


@needs_av
def test_a_name_is_added_once_and_an_unknown_one_names_the_field(tmp_path, model):
    store = VoiceStore(tmp_path / "voices")
    store.add("vv", model, "bob", recording(1), None)
    with pytest.raises(Conflict):
        store.add("vv", model, "bob", recording(1), None)
    with pytest.raises(BadRequest, match="no voice 'carol'; its voices: alice, bob") as unknown:
        store.recordings("vv", model, ["alice", "carol"], "voices")
    assert unknown.value.param == "voices"
