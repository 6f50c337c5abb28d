"""PCM16 as the realtime socket carries it, turned into what the services take and back:
samples, a WAV file for a transcriber, a voice's WAV answer at the session's rate."""

from __future__ import annotations

import io
import wave

import numpy as np


def samples_of(pcm16: bytes) -> np.ndarray:
    """Mono float32 samples in [-1, 1] from little-endian 16-bit PCM."""
    return np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype="<i2").astype(np.float32) / 32768


def pcm16_of(samples: np.ndarray) -> bytes:
    """Little-endian 16-bit PCM from float samples (clipped to [-1, 1])."""
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def resampled(samples: np.ndarray, rate: int, to_rate: int) -> np.ndarray:
    """``samples`` at ``to_rate``, by linear interpolation (speech in, voices out: enough)."""
    if rate == to_rate or samples.size == 0:
        return samples
    count = max(1, round(samples.size * to_rate / rate))
    at = np.arange(count, dtype=np.float64) * (rate / to_rate)
    return np.interp(at, np.arange(samples.size), samples).astype(np.float32)


def wav_of(pcm16: bytes, rate: int) -> bytes:
    """A mono 16-bit WAV file of ``pcm16`` at ``rate``."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm16)
    return out.getvalue()


def pcm16_from_wav(data: bytes, rate: int) -> bytes:
    """A voice's 16-bit WAV answer as mono PCM16 at ``rate`` (channels mixed, resampled)."""
    with wave.open(io.BytesIO(data), "rb") as file:
        channels, width, own_rate = file.getnchannels(), file.getsampwidth(), file.getframerate()
        frames = file.readframes(file.getnframes())
    if width != 2:
        raise ValueError(f"the voice answered {8 * width}-bit audio, not 16-bit")
    samples = samples_of(frames)
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1)
    return pcm16_of(resampled(samples, own_rate, rate))
