"""Audio in and out through PyAV (its wheels carry FFmpeg, so no system package is needed).

:func:`decode` turns an upload in any container FFmpeg reads (wav, mp3, flac, ogg, webm, m4a,
...) into mono float32 samples at the rate a model wants; :class:`Encoder` turns samples into
the response formats OpenAI's speech endpoint names, piece by piece where the format can be
streamed (mp3, opus, aac, pcm) and whole where its header is written last (wav, flac).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# response_format → (container, codec, sample format, streamable, content type)
FORMATS: dict[str, tuple[str | None, str, str, bool, str]] = {
    "mp3": ("mp3", "libmp3lame", "s16p", True, "audio/mpeg"),
    "opus": ("ogg", "libopus", "s16", True, "audio/ogg"),
    "aac": ("adts", "aac", "fltp", True, "audio/aac"),
    "flac": ("flac", "flac", "s16", False, "audio/flac"),
    "wav": ("wav", "pcm_s16le", "s16", False, "audio/wav"),
    "pcm": (None, "", "", True, "audio/pcm"),  # raw 16-bit little-endian mono, no container
}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


# a reference voice: long enough to hear the speaker in, short enough for the model's prompt
# (VibeVoice reads about 7.5 of its tokens a second of it); quieter than this peak is silence
SHORTEST_VOICE_S = 0.5
LONGEST_VOICE_S = 60.0
SILENCE_PEAK = 1e-3


class AudioError(ValueError):
    """The upload is not audio FFmpeg can read, or holds no sound."""


def voice_problem(samples: np.ndarray, rate: int) -> str | None:
    """Why decoded ``samples`` cannot be a reference voice (too short, too long, silent);
    None when they can. The coordinator checks a voice added live with it, the worker one
    read from a model's folder."""
    seconds = samples.size / rate
    if seconds < SHORTEST_VOICE_S:
        return f"the recording is {seconds:.2f} s long; a voice needs {SHORTEST_VOICE_S:g} s"
    if seconds > LONGEST_VOICE_S:
        return (f"the recording is {seconds:.1f} s long; a voice is at most "
                f"{LONGEST_VOICE_S:g} s")
    if float(np.max(np.abs(samples))) < SILENCE_PEAK:
        return "the recording is silent"
    return None


def decode(data: bytes, rate: int, check: Callable[[], None] | None = None) -> np.ndarray:
    """Mono float32 samples at ``rate`` Hz from an encoded file's bytes. ``check`` is called
    between frames and may raise to stop (a long upload's decoding is seconds of work; a
    cancelled request does not finish it)."""
    import av

    if not data:
        raise AudioError("the file is empty")
    pieces: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioError("the file has no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(audio=0):
                if check is not None:
                    check()
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                pieces.append(out.to_ndarray().reshape(-1))
    except AudioError:
        raise
    except (av.FFmpegError, ValueError, IndexError, EOFError) as exc:
        raise AudioError(f"the file could not be decoded as audio ({type(exc).__name__})") \
            from exc
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    if samples.size == 0:
        raise AudioError("the file holds no audio samples")
    return samples.astype(np.float32, copy=False)


class _Sink:
    """A write-only file for the muxer: what it writes, taken out piece by piece."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


@dataclass
class Encoded:
    content_type: str
    streamable: bool


class Encoder:
    """Samples in (float32 mono at ``rate``), encoded bytes out: :meth:`add` answers what is
    ready so far (nothing for the formats written whole), :meth:`close` the rest."""

    def __init__(self, response_format: str, rate: int) -> None:
        import av

        container, codec, sample_format, self.streamable, self.content_type = \
            FORMATS[response_format]
        self._raw = container is None
        if self._raw:
            return
        out_rate = rate
        if codec == "libopus" and rate not in _OPUS_RATES:
            out_rate = min((r for r in _OPUS_RATES if r >= rate), default=48000)
        self._sink: _Sink | io.BytesIO = _Sink() if self.streamable else io.BytesIO()
        self._container = av.open(self._sink, mode="w", format=container)
        self._stream = self._container.add_stream(codec, rate=out_rate, layout="mono")
        self._resampler = av.AudioResampler(format=sample_format, layout="mono",
                                            rate=out_rate)
        self._rate = rate
        self._pts = 0

    def add(self, samples: np.ndarray) -> bytes:
        if self._raw:
            return _pcm16(samples)
        import av

        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt",
            layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += samples.size
        for out in self._resampler.resample(frame):
            for packet in self._stream.encode(out):
                self._container.mux(packet)
        return self._sink.take() if isinstance(self._sink, _Sink) else b""

    def close(self) -> bytes:
        if self._raw:
            return b""
        for out in self._resampler.resample(None):
            for packet in self._stream.encode(out):
                self._container.mux(packet)
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        if isinstance(self._sink, _Sink):
            return self._sink.take()
        return self._sink.getvalue()


def _pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
