"""Figures: what an answer told its client it used, read from the answer's bytes as they pass
(a whole body, or each event of a stream) without parsing bodies that may be large."""

from __future__ import annotations

import re
from dataclasses import dataclass

# the names each API gives its counts: OpenAI's usage (chat, completions, embeddings,
# Responses), Anthropic's, Ollama's, llama.cpp's own /completion; in a stream the last figure
# said is the whole count
_NAMES = {
    b"prompt_tokens": "prompt_tokens", b"input_tokens": "prompt_tokens",
    b"prompt_eval_count": "prompt_tokens", b"tokens_evaluated": "prompt_tokens",
    b"completion_tokens": "completion_tokens", b"output_tokens": "completion_tokens",
    b"eval_count": "completion_tokens", b"tokens_predicted": "completion_tokens",
    b"predicted_n": "completion_tokens",
    b"cached_tokens": "cached_tokens", b"cache_read_input_tokens": "cached_tokens",
    b"tokens_cached": "cached_tokens",
}
# figures that only add to another: Anthropic's input_tokens leave out what was read from or
# written to the prompt cache (OpenAI's prompt_tokens include it); llama.cpp's timings say
# the prompt tokens it evaluated (prompt_n) apart from those it took from its cache (cache_n)
_PARTS = (b"cache_creation_input_tokens", b"prompt_n", b"cache_n")
# the prompt's whole count, where an answer says it
_PROMPT = frozenset(name for name, field in _NAMES.items() if field == "prompt_tokens")
_FIGURE = re.compile(rb'"(' + b"|".join((*_NAMES, *_PARTS)) + rb')"\s*:\s*(\d+)')
_IMAGE = re.compile(rb'"b64_json"\s*:')
# a transcription's usage: {"type": "duration", "seconds": N}, or the verbose "duration"
_AUDIO = re.compile(rb'"(?:seconds|duration)"\s*:\s*(\d+(?:\.\d+)?)')


@dataclass(slots=True)
class Figures:
    """The counts one request's answer gave (zero where it said nothing)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    images: int = 0
    steps: int = 0
    audio_seconds: float = 0.0

    def read(self, data: bytes) -> None:
        """Take the token counts ``data`` states (each the last one it states). The prompt
        counts as OpenAI's ``prompt_tokens`` do, what came from a prompt cache included:
        Anthropic's input tokens plus its cache reads and writes, or llama.cpp's timings
        (a stream that asked for no usage) where nothing else says it."""
        if b"_tokens" in data or b"_count" in data or b"_n\"" in data or b"tokens_" in data:
            said: dict[bytes, int] = {}
            for name, value in _FIGURE.findall(data):
                said[name] = int(value)
                if name in _NAMES:
                    setattr(self, _NAMES[name], int(value))
            if b"input_tokens" in said:
                self.prompt_tokens = (said[b"input_tokens"]
                                      + said.get(b"cache_read_input_tokens", 0)
                                      + said.get(b"cache_creation_input_tokens", 0))
            elif b"prompt_n" in said and not _PROMPT.intersection(said):
                self.prompt_tokens = said[b"prompt_n"] + said.get(b"cache_n", 0)
                if b"cache_n" in said and not said.keys() & {b"cached_tokens", b"tokens_cached"}:
                    self.cached_tokens = said[b"cache_n"]

    def read_images(self, data: bytes) -> None:
        """Count the images a whole images answer carries."""
        self.images = len(_IMAGE.findall(data))

    def read_audio(self, data: bytes, header: str | None) -> None:
        """The seconds of audio heard: the worker's header, else the answer's usage."""
        if header:
            try:
                self.audio_seconds = float(header)
                return
            except ValueError:
                pass
        found = _AUDIO.findall(data)
        if found:
            self.audio_seconds = float(found[-1])
