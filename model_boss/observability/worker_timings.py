"""The worker's own account of an answer, its ``timings`` object, told as the worker call's
attributes and children where traces are on.

Each worker kind says its own part:

- llama.cpp (a whole answer's ``timings``, a stream's last event's): prompt processing and
  generation, their token counts and milliseconds (``llama_cpp.prompt_processing``,
  ``llama_cpp.generation``), generation ending with the last chunk;
- the diffusers worker (a picture's ``x_model_boss.timings``, a clip's figures header): its
  wait for the weights, the denoising (``diffusers.denoise``, with the steps run) and each
  step in it (``diffusers.step``: the first's includes encoding the prompt), then the VAE's
  decode (``diffusers.decode``) and a clip's MP4 encoding (``diffusers.encode``), laid from
  the call's start;
- the transformers worker (an embedding's or rerank's ``timings``): the batch the request ran
  in (``transformers.batch``: its items and requests, the request's wait before it), ending
  as the answer came.

The worker's clock is its own: its spans are placed from the coordinator's (the call's start,
or the answer's arrival) by the durations the worker measured, and never past the answer.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from . import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["read", "tell"]

_TIMINGS = re.compile(rb'"timings"\s*:\s*(\{[^{}]*\})')
_LLAMA = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n")
_DIFFUSERS = ("queue_s", "denoise_s", "decode_s", "encode_s", "total_s")
# the transformers worker's figures of a batch (workers/transformers/batcher.BATCH_FIGURES)
_BATCH = {"batch_size": "model_boss.batch.size", "batch_requests": "model_boss.batch.requests",
          "batch_wait_ms": "model_boss.batch.wait_ms", "batch_ms": "model_boss.batch.ms"}


def read(data: bytes) -> dict[str, Any] | None:
    """The last ``timings`` object in ``data`` (a whole answer, or a stream's chunk): its
    numbers and lists of numbers only; None when it has none."""
    if b'"timings"' not in data:
        return None
    found = _TIMINGS.findall(data)
    if not found:
        return None
    import orjson

    try:
        timings = orjson.loads(found[-1])
    except orjson.JSONDecodeError:
        return None
    return {name: value for name, value in timings.items() if _number(value) or (
        isinstance(value, list) and all(_number(each) for each in value))}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def tell(timings: dict[str, Any] | None, worker: Span, began_ns: int, ended_ns: int) -> None:
    """``timings`` on ``worker`` (the call that began at ``began_ns`` and whose answer came
    at ``ended_ns``), with the parts the worker's kind says as its children."""
    if not timings:
        return
    if "predicted_ms" in timings or "prompt_ms" in timings:
        _llama(timings, worker, ended_ns)
    elif "denoise_s" in timings:
        _diffusers(timings, worker, began_ns, ended_ns)
    elif "batch_ms" in timings:
        _batch(timings, worker, ended_ns)


def _llama(timings: dict[str, Any], worker: Span, end: int) -> None:
    """Prompt processing and generation, each as long as llama.cpp's timings say,
    generation ending with the last chunk."""
    tracing.annotate({f"llama_cpp.timings.{name}": timings[name] for name in _LLAMA
                      if name in timings}, worker)
    generated = int(timings.get("predicted_ms", 0.0) * 1e6)
    prompt = int(timings.get("prompt_ms", 0.0) * 1e6)
    tracing.ended_span("llama_cpp.generation", end - generated, end, {
        "gen_ai.usage.output_tokens": int(timings.get("predicted_n", 0))}, parent=worker)
    tracing.ended_span("llama_cpp.prompt_processing", end - generated - prompt,
                       end - generated, {
                           "gen_ai.usage.input_tokens": int(timings.get("prompt_n", 0)),
                           "model_boss.cached_tokens": int(timings.get("cache_n", 0))},
                       parent=worker)


def _diffusers(timings: dict[str, Any], worker: Span, began: int, end: int) -> None:
    """The denoising, its steps and the decode, laid from the call's start after the
    worker's wait for its weights."""
    step_ends = timings.get("step_end_s") or []
    steps = int(timings.get("steps", len(step_ends)))
    tracing.annotate({"model_boss.diffusion.steps": steps,
                      **{f"diffusers.timings.{name}": timings[name] for name in _DIFFUSERS
                         if name in timings}}, worker)

    def at(seconds: float) -> int:
        return min(end, began + int(seconds * 1e9))

    started = float(timings.get("queue_s", 0.0))
    denoised = started + float(timings.get("denoise_s", 0.0))
    denoise = tracing.ended_span("diffusers.denoise", at(started), at(denoised), {
        "model_boss.diffusion.steps": steps}, parent=worker)
    previous = 0.0
    for number, step_end in enumerate(step_ends, start=1):
        tracing.ended_span("diffusers.step", at(started + previous), at(started + step_end),
                           {"model_boss.diffusion.step": number}, parent=denoise)
        previous = step_end
    decoded = denoised + float(timings.get("decode_s", 0.0))
    if "decode_s" in timings:
        tracing.ended_span("diffusers.decode", at(denoised), at(decoded), parent=worker)
    if "encode_s" in timings:  # a clip's frames into an MP4
        tracing.ended_span("diffusers.encode", at(decoded),
                           at(decoded + float(timings["encode_s"])), parent=worker)


def _batch(timings: dict[str, Any], worker: Span, end: int) -> None:
    """The batch the request ran in, ending as its answer came."""
    figures = {attribute: timings[name] for name, attribute in _BATCH.items()
               if name in timings}
    tracing.annotate(figures, worker)
    ran = int(float(timings["batch_ms"]) * 1e6)
    tracing.ended_span("transformers.batch", end - ran, end, {
        attribute: value for attribute, value in figures.items()
        if attribute != "model_boss.batch.ms"}, parent=worker)
