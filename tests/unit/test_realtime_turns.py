"""Turn detection: the segmenter's rule over tables of probabilities, and silero-vad over
synthetic audio (silence, then espeak-ng's speech, then silence)."""

from __future__ import annotations

import numpy as np
import pytest

from model_boss.services.realtime import SileroTurns, SpeechStarted, SpeechStopped, TurnSegmenter
from model_boss.services.realtime.audio import pcm16_from_wav, pcm16_of, resampled, wav_of
from tests.realtime_fixtures import needs_espeak, silence, spoken


@pytest.mark.parametrize(("probabilities", "silence_ms", "expected"), [
    ([0.1] * 10, 100, []),
    ([0.1, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1], 100,
     [(1, SpeechStarted(32)), (6, SpeechStopped(96))]),
    # a pause shorter than the silence length does not end the turn
    ([0.9, 0.1, 0.1, 0.9, 0.1, 0.1, 0.1, 0.1], 100, [(0, SpeechStarted(0)),
                                                     (7, SpeechStopped(128))]),
    ([0.9, 0.1, 0.1, 0.9, 0.1, 0.1], 50, [(0, SpeechStarted(0)), (2, SpeechStopped(32)),
                                          (3, SpeechStarted(96 - 0)), (5, SpeechStopped(128))]),
    # exactly the threshold is speech
    ([0.5, 0.4, 0.4], 64, [(0, SpeechStarted(0)), (2, SpeechStopped(32))]),
])
def test_the_segmenter_ends_a_turn_after_the_silence_length(probabilities, silence_ms,
                                                            expected):
    segmenter = TurnSegmenter(threshold=0.5, silence_ms=silence_ms, prefix_ms=0)
    found = [(i, b) for i, p in enumerate(probabilities) if (b := segmenter.feed(p))]
    assert found == expected


def test_the_start_is_put_the_prefix_padding_before_the_first_voiced_frame():
    segmenter = TurnSegmenter(prefix_ms=50)
    assert [segmenter.feed(p) for p in (0.0, 0.0, 0.0, 0.9)][-1] == SpeechStarted(96 - 50)


def test_pcm_round_trips_through_wav_and_resampling():
    tone = pcm16_of(0.5 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440))
    at_24k = pcm16_from_wav(wav_of(tone, 16000), 24000)
    assert len(at_24k) == 2 * 24000
    assert resampled(np.ones(3, dtype=np.float32), 8000, 8000).size == 3


@needs_espeak
def test_silero_hears_speech_between_silences_and_nothing_in_silence():
    turns = SileroTurns(TurnSegmenter(silence_ms=400, prefix_ms=0), 24000)
    audio = silence(1.0) + spoken("What is the capital of France?") + silence(1.0)
    chunk = 480 * 2  # 20 ms at 24 kHz
    found = [b for at in range(0, len(audio), chunk) for b in turns.hear(audio[at:at + chunk])]
    assert [type(b) for b in found] == [SpeechStarted, SpeechStopped]
    start, stop = found[0].audio_start_ms, found[1].audio_end_ms
    speech_ms = (len(audio) / 48 - 2000)
    assert 800 <= start <= 1300
    assert 1000 + speech_ms - 400 <= stop <= 1000 + speech_ms + 300

    quiet = SileroTurns(TurnSegmenter(), 24000)
    assert quiet.hear(silence(2.0)) == []
