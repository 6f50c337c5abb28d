"""Figures: the token counts read from an answer's bytes as they pass, each API's names, the
prompt always counted as OpenAI counts it (what came from a prompt cache included)."""

from __future__ import annotations

import pytest

from model_boss.tenancy.usage import Figures


def read(*chunks: bytes) -> tuple[int, int, int]:
    figures = Figures()
    for chunk in chunks:
        figures.read(chunk)
    return figures.prompt_tokens, figures.completion_tokens, figures.cached_tokens


@pytest.mark.parametrize(("chunks", "expected"), [
    # OpenAI: prompt_tokens include the cached ones
    ([b'{"usage": {"prompt_tokens": 31, "completion_tokens": 8, '
      b'"prompt_tokens_details": {"cached_tokens": 30}}}'], (31, 8, 30)),
    # a whole llama.cpp answer says both usage and timings: usage wins
    ([b'{"usage": {"completion_tokens": 4, "prompt_tokens": 31, "prompt_tokens_details": '
      b'{"cached_tokens": 30}}, "timings": {"cache_n": 30, "prompt_n": 1, "predicted_n": 4}}'],
     (31, 4, 30)),
    # a llama.cpp stream that asked for no usage: its last chunk's timings alone
    ([b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n',
      b'data: {"choices": [{"finish_reason": "length", "delta": {}}], "timings": '
      b'{"cache_n": 30, "prompt_n": 1, "prompt_ms": 4.1, "predicted_n": 6}}\n\n'], (31, 6, 30)),
    # ... then a usage chunk (include_usage): the same figures
    ([b'data: {"timings": {"cache_n": 0, "prompt_n": 31, "predicted_n": 6}}\n\n',
      b'data: {"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 6}}\n\n'],
     (31, 6, 0)),
    # Anthropic: input_tokens leave out the cache's reads and writes
    ([b'{"usage": {"cache_read_input_tokens": 30, "input_tokens": 1, "output_tokens": 4}}'],
     (31, 4, 30)),
    ([b'{"usage": {"input_tokens": 5, "cache_creation_input_tokens": 20, '
      b'"cache_read_input_tokens": 0, "output_tokens": 2}}'], (25, 2, 0)),
    # ... and its stream: message_start, then message_delta with the output alone
    ([b'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
      b'{"cache_read_input_tokens": 30, "input_tokens": 1, "output_tokens": 0}}}\n\n',
      b'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 4}}'
      b'\n\n'], (31, 4, 30)),
    # OpenAI's Responses API: input_tokens include the cached ones
    ([b'{"usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 8}, '
      b'"output_tokens": 3}}'], (12, 3, 8)),
    # Ollama, and llama.cpp's own /completion (its timings are not the prompt's count)
    ([b'{"done": true, "prompt_eval_count": 31, "eval_count": 4}'], (31, 4, 0)),
    ([b'{"tokens_evaluated": 9, "tokens_predicted": 4, "tokens_cached": 8, '
      b'"timings": {"cache_n": 8, "prompt_n": 1, "predicted_n": 4}}'], (9, 4, 8)),
    ([b'{"choices": [{"message": {"content": "no figures"}}]}'], (0, 0, 0)),
])
def test_each_apis_figures_count_the_whole_prompt(chunks, expected):
    assert read(*chunks) == expected
