"""VibeVoice: transformers' ``VibeVoiceForConditionalGeneration`` and its processor, speaking a
script (workers/transformers/script.py) in the voices of reference recordings.

The coordinator resolves the request's voice names into recordings (``voice_audio``: base64
files, one per speaker, from the model's ``voices/`` folder or the ones added live); here they
are decoded, checked, and laid into the processor's chat template. The audio is streamed as
it is made: the library's generate decodes one chunk of audio per audio token and hands it to
the semantic tokenizer's encoder before the next step, so a forward pre-hook on that encoder
sees each chunk as it is born (generate's own ``streamer`` sees only token ids). A cancel
stops generation at the next chunk; ``seed`` seeds torch's generator for the whole request,
so the same seed, text and voices give the same samples.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np

from .audio import AudioError, Encoder, decode, voice_problem
from .errors import WorkerError
from .script import Script, ScriptError, parse_script

log = logging.getLogger(__name__)

MODEL_TYPE = "vibevoice"
# audio tokens a character of text may take at most (the model stops at its end of speech
# long before: ~7.5 tokens a second of speech, ~15 characters a second)
TOKENS_PER_CHAR = 2
LEAST_TOKENS = 64


def is_vibevoice(folder: str | Path) -> bool:
    """Whether a model folder holds a VibeVoice (its config's ``model_type``)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


class VibeVoice:
    """The model and its processor, loaded from a local folder; one request at a time (the
    engine's lock)."""

    def __init__(self, folder: str, device: str, dtype: Any) -> None:
        from transformers import AutoProcessor, VibeVoiceForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        self.model = VibeVoiceForConditionalGeneration.from_pretrained(
            folder, local_files_only=True, **kwargs).to(device).eval()
        self.rate: int = self.processor.feature_extractor.sampling_rate
        self._heard: Callable[[Any], None] | None = None
        self.model.model.semantic_tokenizer_encoder.register_forward_pre_hook(self._chunk)

    def _chunk(self, _module: Any, args: Any) -> None:
        if self._heard is not None:
            self._heard(args[0])

    def speak(self, script: Script, voices: list[np.ndarray], seed: int | None,
              heard: Callable[[np.ndarray], None], check: Callable[[], None]) -> None:
        """Generate ``script`` in ``voices`` (one per speaker), handing each chunk of samples
        to ``heard`` as it is made; ``check`` may raise to stop before the next chunk."""
        import torch

        seen: set[int] = set()
        conversation = []
        for turn in script.turns:
            content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}]
            if turn.speaker not in seen:  # a speaker's voice once, where it first speaks
                seen.add(turn.speaker)
                content.append({"type": "audio", "audio": voices[turn.speaker]})
            conversation.append({"role": str(turn.speaker), "content": content})
        inputs = self.processor.apply_chat_template(
            conversation, tokenize=True, return_dict=True,
            return_tensors="pt").to(self.model.device)
        limit = max(LEAST_TOKENS, TOKENS_PER_CHAR * sum(len(t.text) for t in script.turns))
        configured = self.model.generation_config.max_new_tokens
        if configured:
            limit = min(limit, configured)

        def chunk(audio: Any) -> None:
            check()
            heard(audio[0].reshape(-1).float().cpu().numpy())

        self._heard = chunk
        try:
            with torch.inference_mode():
                torch.manual_seed(seed if seed is not None else torch.seed())
                self.model.generate(**inputs, max_new_tokens=limit)
        finally:
            self._heard = None


def voice_samples(recordings: list[str], names: list[str], param: str,
                  rate: int) -> list[np.ndarray]:
    """Each base64 recording decoded at ``rate`` and checked; a 400 naming ``param`` and the
    voice for one the model cannot take."""
    samples = []
    for name, recording in zip(names, recordings, strict=True):
        try:
            data = base64.b64decode(recording, validate=True)
            voice = decode(data, rate)
        except (binascii.Error, ValueError, AudioError) as exc:
            raise WorkerError(400, f"{param}: voice {name!r} is not audio ({exc})",
                              "invalid_voice", param) from None
        problem = voice_problem(voice, rate)
        if problem:
            raise WorkerError(400, f"{param}: voice {name!r}: {problem}", "invalid_voice",
                              param)
        samples.append(voice)
    return samples


def read_script(text: str, voices: int, param: str) -> Script:
    """``input`` as a script for ``voices`` voices; a 400 naming the field that is wrong."""
    try:
        script = parse_script(text)
    except ScriptError as exc:
        raise WorkerError(400, f"input: {exc}", "invalid_script", "input") from None
    if script.speakers != voices:
        raise WorkerError(
            400, f"{param}: the script has {script.speakers} speaker(s) and {voices} voice(s) "
            "were named; name one voice per speaker in 'voices'", "invalid_value", param)
    return script


async def spoken(speak: Callable[[Callable[[np.ndarray], None]], None], encoder: Encoder,
                 stop: Callable[[], None]) -> AsyncIterator[bytes]:
    """Encoded audio as ``speak`` (run in a thread) hands out samples: each piece as soon as
    the encoder has bytes for it; an error raised by ``speak`` is raised here. Left before
    its end, ``stop`` is called and the thread waited for (it stops at its next chunk)."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[np.ndarray | None] = asyncio.Queue()

    def heard(samples: np.ndarray) -> None:
        loop.call_soon_threadsafe(pieces.put_nowait, samples)

    def run() -> None:
        try:
            speak(heard)
        finally:
            loop.call_soon_threadsafe(pieces.put_nowait, None)

    work = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        while (samples := await pieces.get()) is not None:
            encoded = encoder.add(samples)
            if encoded:
                yield encoded
        await work  # raises what generation raised
        yield encoder.close()
    finally:
        if not work.done():
            stop()
            with contextlib.suppress(Exception):
                await work
