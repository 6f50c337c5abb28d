"""Spoken audio for the realtime tests: espeak-ng's voice as PCM16 at the socket's rate; and a
tiny Whisper that writes letters."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from model_boss.services.realtime.audio import pcm16_from_wav

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng is not installed (apt-get install espeak-ng)")


def spoken(text: str, rate: int = 24000) -> bytes:
    """``text`` said by espeak-ng, as mono PCM16 at ``rate``."""
    wav = subprocess.run(["espeak-ng", "--stdout", "-s", "160", text], check=True,
                         capture_output=True, timeout=30).stdout
    return pcm16_from_wav(wav, rate)


def silence(seconds: float, rate: int = 24000) -> bytes:
    return bytes(2 * int(seconds * rate))


def build_lettered_whisper(path: Path) -> Path:
    """The tests' tiny random-weight Whisper (``build_whisper``) told to write only letters and
    spaces, and at least one: what it hears is noise either way, but a chat model answers
    letters with words a voice can say, where its raw bytes are echoed back as bytes."""
    from transformers import WhisperTokenizer

    from tests.transformers_fixtures import build_whisper

    build_whisper(path)
    tokenizer = WhisperTokenizer.from_pretrained(str(path))
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    allowed = {index for token, index in tokenizer.get_vocab().items()
               if token.replace("Ġ", "").isascii() and token.replace("Ġ", "").isalpha()}
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    # everything before the timestamps (which the pipeline's timestamp rules need)
    config["suppress_tokens"] = [index for index in
                                 range(tokenizer.convert_tokens_to_ids("<|0.00|>"))
                                 if index not in allowed and index != end]
    config["begin_suppress_tokens"] = [end]
    config_file.write_text(json.dumps(config))
    return path
