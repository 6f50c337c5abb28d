"""Spoken audio for the realtime tests: espeak-ng's voice as PCM16 at the socket's rate."""

from __future__ import annotations

import shutil
import subprocess

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
