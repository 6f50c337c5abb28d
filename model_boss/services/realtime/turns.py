"""Turn detection: where speech starts and where a turn ends, from voice probabilities.

:class:`TurnSegmenter` is the pure rule (speech once a frame's probability reaches the
threshold; the turn ends after ``silence_ms`` under it), tested over tables of numbers.
:class:`SileroTurns` feeds it silero-vad's probabilities for the session's audio, the model run
off the event loop by its caller."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .audio import resampled, samples_of

VAD_RATE = 16000  # silero-vad's rate, and its frame: 512 samples (32 ms)
VAD_FRAME = 512
FRAME_MS = VAD_FRAME * 1000 // VAD_RATE


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int


Boundary = SpeechStarted | SpeechStopped


class TurnSegmenter:
    """Frames' voice probabilities in, turn boundaries out. The end sits where the silence
    began (``audio_end_ms``), said once ``silence_ms`` of it has passed; a start is put
    ``prefix_ms`` before the first voiced frame, as OpenAI's server VAD does."""

    def __init__(self, threshold: float = 0.5, silence_ms: int = 500,
                 prefix_ms: int = 300, frame_ms: int = FRAME_MS) -> None:
        self.threshold, self.silence_ms = threshold, silence_ms
        self.prefix_ms, self.frame_ms = prefix_ms, frame_ms
        self.at_ms = 0  # audio heard so far
        self.speaking = False
        self._quiet_since: int | None = None

    def feed(self, probability: float) -> Boundary | None:
        """One frame's probability; the boundary it makes, if any."""
        start, self.at_ms = self.at_ms, self.at_ms + self.frame_ms
        voiced = probability >= self.threshold
        if not self.speaking:
            if voiced:
                self.speaking, self._quiet_since = True, None
                return SpeechStarted(max(0, start - self.prefix_ms))
            return None
        if voiced:
            self._quiet_since = None
            return None
        if self._quiet_since is None:
            self._quiet_since = start
        if self.at_ms - self._quiet_since >= self.silence_ms:
            self.speaking = False
            return SpeechStopped(self._quiet_since)
        return None


class SileroTurns:
    """silero-vad over a session's PCM16 at ``rate``: :meth:`hear` (blocking: run it in a
    thread) takes a chunk and gives the boundaries it completes. One per session (the model
    keeps state between frames)."""

    def __init__(self, segmenter: TurnSegmenter, rate: int) -> None:
        from silero_vad import load_silero_vad  # torch: imported when a session opens

        with warnings.catch_warnings():  # its loader's torch.jit.load, deprecated in torch
            warnings.simplefilter("ignore", DeprecationWarning)
            self.model = load_silero_vad()
        self.segmenter, self.rate = segmenter, rate
        self._pending = np.zeros(0, dtype=np.float32)

    def hear(self, pcm16: bytes) -> list[Boundary]:
        import torch

        samples = resampled(samples_of(pcm16), self.rate, VAD_RATE)
        self._pending = np.concatenate([self._pending, samples])
        found: list[Boundary] = []
        with torch.inference_mode():
            while self._pending.size >= VAD_FRAME:
                frame, self._pending = self._pending[:VAD_FRAME], self._pending[VAD_FRAME:]
                probability = float(self.model(torch.from_numpy(frame.copy()), VAD_RATE))
                if (boundary := self.segmenter.feed(probability)) is not None:
                    found.append(boundary)
        return found

    def reset(self) -> None:
        """Forget what was heard (a cleared buffer): the model's state and the segmenter's."""
        self.model.reset_states()
        self._pending = np.zeros(0, dtype=np.float32)
        self.segmenter.speaking = False
