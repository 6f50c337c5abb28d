"""Reference voices: the recordings a voice-cloning model (VibeVoice) speaks in.

A model's voices are the audio files in its folder's ``voices/`` (named by their stems), and
the ones added while the daemon runs (``POST /api/v1/voices``), kept under
``<state_dir>/voices/<model>/`` as ``<name>.wav`` (mono, 16-bit, 24 kHz: the recording as it
was decoded) beside ``<name>.json`` (who added it, when, how long it is). An added voice is
decoded by the decoder the speech routes use (PyAV) and checked as the worker checks a
folder's (not audio, silent, too short or too long: a 400 naming ``file``) before it is
kept. A name is one model's: a folder voice's name cannot be added again; an added one is
replaced only after it is deleted. Files are written whole and linked into place, so a
reader (the backend resolving a request's voices) never sees half of one.
"""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

from ..errors import BadRequest, Conflict, ModelUnavailable, NotFound

VOICES_DIR = "voices"  # in a model's folder, and in state_dir
AUDIO_SUFFIXES = (".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a", ".webm", ".aac")
STORED_RATE = 24000  # VibeVoice's rate; a model at another rate resamples on reading
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
CLONING_TYPES = ("vibevoice",)  # config.json model_type of the models that take voices


def clones_voices(model_path: str | Path | None) -> bool:
    """Whether the model at ``model_path`` speaks in reference voices (its config says)."""
    if not model_path:
        return False
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") in CLONING_TYPES


@dataclass(frozen=True, slots=True)
class Voice:
    """One reference voice of one model."""

    name: str
    model: str
    source: str  # "folder" | "added"
    path: Path
    added_by: str | None = None
    created_at: float | None = None
    seconds: float | None = None

    def card(self) -> dict[str, object]:
        return {"name": self.name, "model": self.model, "source": self.source,
                "added_by": self.added_by, "created_at": self.created_at,
                "seconds": self.seconds}


def folder_voices(model_id: str, model_path: str | Path) -> list[Voice]:
    """The audio files in the model's ``voices/`` folder, by name."""
    folder = Path(model_path) / VOICES_DIR
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file()
                       and p.suffix.lower() in AUDIO_SUFFIXES and not p.name.startswith("."))
    except OSError:
        return []
    return [Voice(p.stem, model_id, "folder", p) for p in files]


class VoiceStore:
    """The voices added live, under ``root`` (``<state_dir>/voices``), with each model's
    folder voices beside them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _folder(self, model_id: str) -> Path:
        return self.root / quote(model_id, safe="")

    def added(self, model_id: str) -> list[Voice]:
        folder = self._folder(model_id)
        try:
            files = sorted(folder.glob("*.wav"))
        except OSError:
            return []
        voices = []
        for path in files:
            try:
                meta = json.loads(path.with_suffix(".json").read_text())
            except (OSError, ValueError):
                meta = {}
            voices.append(Voice(path.stem, model_id, "added", path, meta.get("added_by"),
                                meta.get("created_at"), meta.get("seconds")))
        return voices

    def voices(self, model_id: str, model_path: str | Path) -> list[Voice]:
        """Every voice the model may speak in: its folder's, then the added ones."""
        return [*folder_voices(model_id, model_path), *self.added(model_id)]

    def find(self, model_id: str, model_path: str | Path, name: str) -> Voice | None:
        return next((v for v in self.voices(model_id, model_path) if v.name == name), None)

    def recordings(self, model_id: str, model_path: str | Path, names: list[str],
                   param: str) -> list[str]:
        """The base64 recordings of ``names``, in order; a 400 naming ``param`` and the
        model's voices for a name it does not have."""
        known = {v.name: v for v in self.voices(model_id, model_path)}
        recordings = []
        for name in names:
            voice = known.get(name)
            if voice is None:
                listed = ", ".join(sorted(known)) or "none yet (POST /api/v1/voices)"
                raise BadRequest(f"{param}: '{model_id}' has no voice {name!r}; its voices: "
                                 f"{listed}", param=param, code="voice_not_found")
            try:
                recordings.append(base64.b64encode(voice.path.read_bytes()).decode())
            except OSError:  # deleted since it was listed
                raise BadRequest(f"{param}: voice {name!r} is gone", param=param,
                                 code="voice_not_found") from None
        return recordings

    def add(self, model_id: str, model_path: str | Path, name: str, data: bytes,
            added_by: str | None) -> Voice:
        """Decode, check and keep a recording as the model's voice ``name``."""
        if not NAME.match(name):
            raise BadRequest("name: letters, digits, '.', '_' and '-', at most 64, starting "
                             "with a letter or digit", param="name", code="invalid_value")
        if any(v.name == name for v in folder_voices(model_id, model_path)):
            raise Conflict(f"name: '{model_id}' has a voice {name!r} in its folder",
                           param="name")
        samples = _decoded(data)
        folder = self._folder(model_id)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{name}.wav"
        seconds = round(samples.size / STORED_RATE, 3)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".partial", delete=False) as tmp:
            _write_wav(tmp, samples)
        try:
            os.link(tmp.name, target)  # fails when the name is taken: never overwritten
        except FileExistsError:
            raise Conflict(f"name: '{model_id}' has a voice {name!r} already (DELETE it "
                           "first)", param="name") from None
        finally:
            os.unlink(tmp.name)
        created = time.time()
        meta = target.with_suffix(".json")
        meta.with_suffix(".json.partial").write_text(json.dumps(
            {"added_by": added_by, "created_at": created, "seconds": seconds}))
        os.replace(meta.with_suffix(".json.partial"), meta)
        return Voice(name, model_id, "added", target, added_by, created, seconds)

    def remove(self, model_id: str, name: str) -> None:
        target = self._folder(model_id) / f"{name}.wav"
        if not NAME.match(name) or not target.exists():
            raise NotFound(f"'{model_id}' has no added voice {name!r}", param="name")
        target.unlink(missing_ok=True)
        target.with_suffix(".json").unlink(missing_ok=True)


def voice_store(state_path: Path) -> VoiceStore:
    """The daemon's store (the one place its folder is named)."""
    return VoiceStore(state_path / VOICES_DIR)


def _decoded(data: bytes) -> np.ndarray:
    try:
        from workers.transformers.audio import AudioError, decode, voice_problem
    except ImportError:  # numpy is the coordinator's; PyAV is the speech workers' extra
        raise ModelUnavailable("voices are decoded by PyAV: install the 'transformers' "
                               "extra") from None
    try:
        samples = decode(data, STORED_RATE)
    except AudioError as exc:
        raise BadRequest(f"file: {exc}", param="file", code="invalid_audio") from None
    except ImportError:
        raise ModelUnavailable("voices are decoded by PyAV: install the 'transformers' "
                               "extra") from None
    problem = voice_problem(samples, STORED_RATE)
    if problem:
        raise BadRequest(f"file: {problem}", param="file", code="invalid_voice")
    return samples


def _write_wav(file: object, samples: np.ndarray) -> None:
    with wave.open(file, "wb") as out:  # type: ignore[arg-type]
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(STORED_RATE)
        out.writeframes((np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes())
