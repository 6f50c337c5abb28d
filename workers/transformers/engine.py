"""The model: a sentence-transformers embedder, a CrossEncoder reranker, or one of transformers'
speech pipelines (recognition: Whisper, Wav2Vec2 and the other CTC models; synthesis: VITS/MMS
and the others its text-to-speech pipeline loads), or a VibeVoice (voices cloned from
reference recordings: workers/transformers/vibevoice.py), loaded from a local folder as the library
loads a downloaded one; moved between the device and CPU RAM."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..process import collector_paused
from .layers import LayerPlan, offload_layers, place_resident
from .options import WorkerOptions
from .vibevoice import VibeVoice, is_vibevoice

log = logging.getLogger(__name__)


CHUNK_S = 30.0  # audio longer than this is recognised in chunks of it


def _stamp(value: Any, default: float) -> float:
    return round(float(value), 2) if value is not None else round(default, 2)


def _sentences(words: list[dict[str, Any]], gap_s: float = 0.6,
               most: int = 24) -> list[tuple[float, float, str]]:
    """Words grouped into segments: a new one after a pause or every ``most`` words."""
    segments: list[tuple[float, float, str]] = []
    group: list[dict[str, Any]] = []
    for word in words:
        if group and (word["start"] - group[-1]["end"] > gap_s or len(group) >= most):
            segments.append((group[0]["start"], group[-1]["end"],
                             " ".join(w["word"] for w in group)))
            group = []
        group.append(word)
    if group:
        segments.append((group[0]["start"], group[-1]["end"], " ".join(w["word"] for w in group)))
    return segments


MB = 2**20


def _footprint_mb(module: Any) -> int:
    """The bytes of a module's parameters and buffers, in MB (at least 1)."""
    tensors = [*module.parameters(), *module.buffers()]
    return max(1, sum(t.numel() * t.element_size() for t in tensors) // MB)


def _cuda_memory() -> dict[str, int]:
    """What torch holds on the visible GPUs (the coordinator learns VRAM from it)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    devices = range(torch.cuda.device_count())
    return {"cuda_allocated_mb": sum(torch.cuda.memory_allocated(d) for d in devices) // MB,
            "cuda_reserved_mb": sum(torch.cuda.memory_reserved(d) for d in devices) // MB}


class Busy(RuntimeError):
    """A ``POST /load`` to a worker that already has its model."""


def preimport() -> None:
    """What a spare imports ahead of its model: torch, sentence-transformers and
    transformers' pipelines. Touches no CUDA API, so ``CUDA_VISIBLE_DEVICES`` set at
    ``POST /load`` still decides which GPUs the worker sees."""
    import torch  # noqa: F401
    from sentence_transformers import CrossEncoder, SentenceTransformer  # noqa: F401
    from transformers import pipeline  # noqa: F401
    from transformers.pipelines import (  # noqa: F401
        AutomaticSpeechRecognitionPipeline,
        TextToAudioPipeline,
    )


class NotLoaded(RuntimeError):
    """The model is loading, failed to load, or is parked in CPU RAM."""


class Engine:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.model: Any = None
        # spare (no model yet) | loading | ready | offloaded | failed
        self.state = "spare" if options.spare else "loading"
        self.error: str | None = None
        self.device = "cpu"
        self.dimensions: int | None = None
        self.max_tokens: int | None = None
        self.rate: int | None = None  # speech: the sampling rate the model hears or speaks
        self.footprint_mb: int | None = None  # the weights and buffers, once loaded
        self.load_s: float | None = None
        self.whisper = False
        self._lock = threading.Lock()  # one model call or move at a time
        self._ticket: Any = None  # the running transcription's (checked at each forward)
        self.layers: LayerPlan | None = None  # the blocks streamed from CPU RAM, if any

    def assign(self, options: WorkerOptions) -> None:
        """A spare takes its model's options (once); a worker that is no spare is busy."""
        with self._lock:
            if self.state != "spare":
                raise Busy(f"this worker is not a spare (it is {self.state})")
            self.options, self.state = options, "loading"

    def load(self) -> None:
        with collector_paused():  # torch, the libraries and the model's modules come in
            self._load()

    def _load(self) -> None:
        import torch

        started = time.perf_counter()
        try:
            wanted = self.options.device
            self.device = ("cuda" if torch.cuda.is_available() else "cpu") \
                if wanted == "auto" else wanted
            # a split model is loaded in CPU RAM, then only its resident part goes to the device
            split = self.options.gpu_layers is not None and self.options.gpu_layers >= 0
            kwargs: dict[str, Any] = {"device": "cpu" if split else self.device,
                                      "local_files_only": True}
            if self.options.dtype != "auto":
                kwargs["model_kwargs"] = {"torch_dtype": getattr(torch, self.options.dtype)}
            if self.options.task == "embedding":
                # imported here: a speech model's worker never pays for sentence-transformers
                from sentence_transformers import SentenceTransformer

                self.model = SentenceTransformer(self.options.model, **kwargs)
                dimension = getattr(self.model, "get_embedding_dimension", None) or \
                    self.model.get_sentence_embedding_dimension
                self.dimensions = dimension()
                self.max_tokens = self.model.max_seq_length
            elif self.options.task == "rerank":
                from sentence_transformers import CrossEncoder

                self.model = CrossEncoder(self.options.model, **kwargs)
                self.max_tokens = self.model.max_length
            else:
                self.model = self._pipeline(torch, "cpu" if split else self.device)
                # a long transcription stops at its next chunk (its next forward) once cancelled
                self._module(torch).register_forward_pre_hook(self._between_chunks)
            if split:
                self._split(torch)
            self.footprint_mb = _footprint_mb(self._module(torch))
            self.load_s = round(time.perf_counter() - started, 3)
            self.state = "ready"
            log.info("loaded %s (%s) on %s in %.2fs, %s MB", self.options.model,
                     self.options.task, self.device, self.load_s, self.footprint_mb)
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("loading %s failed", self.options.model)

    def _split(self, torch: Any) -> None:
        """The model's blocks beyond ``gpu_layers`` streamed from CPU RAM, the rest onto the
        device (layers.py); a model with nothing to stream goes to the device whole."""
        module = self._module(torch)
        self.layers = offload_layers(module, self.device, self.options.gpu_layers,
                                     self.options.offload_prefetch)
        if self.layers is None:
            module.to(self.device)
        if hasattr(self.model, "device") and not isinstance(self.model, torch.nn.Module):
            self.model.device = torch.device(self.device)  # a pipeline sends its inputs there
        if self.layers is not None:
            log.info("%s of %s layers (%s) on %s, the rest streamed from CPU RAM%s",
                     self.layers.resident, self.layers.total, self.layers.name, self.device,
                     " with prefetch" if self.layers.prefetch else "")

    def _pipeline(self, torch: Any, device: str) -> Any:
        from transformers import pipeline

        if self.options.task == "tts" and is_vibevoice(self.options.model or ""):
            dtype = getattr(torch, self.options.dtype) if self.options.dtype != "auto" else None
            voice = VibeVoice(self.options.model or "", device, dtype)
            self.rate = voice.rate
            return voice
        kind = {"stt": "automatic-speech-recognition", "tts": "text-to-speech"}[
            self.options.task]
        dtype = getattr(torch, self.options.dtype) if self.options.dtype != "auto" else None
        # a local folder: the worker runs with HF_HUB_OFFLINE set, so nothing is fetched
        pipe = pipeline(kind, model=self.options.model, device=device, dtype=dtype)
        if self.options.task == "stt":
            self.rate = pipe.feature_extractor.sampling_rate
            self.whisper = pipe.model.config.model_type == "whisper"
        else:
            self.rate = pipe.sampling_rate
        return pipe

    @property
    def clones_voices(self) -> bool:
        """A VibeVoice: it speaks scripts in reference voices."""
        return isinstance(self.model, VibeVoice)

    def speak_in_voices(self, script: Any, voices: list[Any], seed: int | None,
                        heard: Any, ticket: Any) -> None:
        """A VibeVoice's speech, chunk by chunk to ``heard``; a cancel of ``ticket`` stops it
        before its next chunk."""
        with self._lock:
            self._ready()
            ticket.check()  # cancelled while it waited for the model
            self.model.speak(script, voices, seed, heard, ticket.check)

    @property
    def speakers(self) -> int:
        """Voices a multi-speaker synthesiser has (1 for the others)."""
        return int(getattr(self.model.model.config, "num_speakers", 1) or 1)

    def _between_chunks(self, _module: Any, _args: Any) -> None:
        if self._ticket is not None:
            self._ticket.check()

    def transcribe(self, samples: Any, *, task: str = "transcribe", language: str | None = None,
                   prompt: str | None = None, temperature: float = 0.0,
                   words: bool = False, ticket: Any = None) -> dict[str, Any]:
        """Text with segment (and, where the model can, word) timestamps. Audio longer than
        the model's window is cut into overlapping chunks the pipeline joins again; a cancel
        of ``ticket`` stops it before the next chunk."""
        with self._lock:
            self._ready()
            if ticket is not None:
                ticket.check()  # cancelled while it waited for the model
            seconds = len(samples) / self.rate
            kwargs: dict[str, Any] = {}
            if seconds > CHUNK_S:
                kwargs.update(chunk_length_s=CHUNK_S, batch_size=1)
            if self.whisper:
                generate: dict[str, Any] = {"task": task}
                if language:
                    generate["language"] = language
                if temperature > 0:
                    generate.update(do_sample=True, temperature=temperature)
                if prompt:
                    generate["prompt_ids"] = self.model.tokenizer.get_prompt_ids(
                        prompt, return_tensors="pt").to(self.device)
                kwargs.update(generate_kwargs=generate, return_timestamps=True,
                              return_language=True)
            else:
                kwargs["return_timestamps"] = "word"
            self._ticket = ticket
            try:
                out = self.model({"raw": samples, "sampling_rate": self.rate}, **kwargs)
            finally:
                self._ticket = None
        chunks = []
        for chunk in out.get("chunks") or []:  # times kept within the clip
            start = min(_stamp(chunk["timestamp"][0], 0.0), seconds)
            end = min(max(_stamp(chunk["timestamp"][1], seconds), start), seconds)
            if start < seconds or chunk["text"].strip():
                chunks.append((round(start, 2), round(end, 2), chunk["text"]))
            language = language or chunk.get("language")
        if self.whisper:
            segments, spoken = chunks, []
        else:
            spoken = [{"word": text.strip(), "start": start, "end": end}
                      for start, end, text in chunks]
            segments = _sentences(spoken)
        return {"text": out["text"].strip(), "duration": round(seconds, 3),
                "language": language or ("en" if not self.whisper else None),
                "segments": [{"start": start, "end": end, "text": text}
                             for start, end, text in segments],
                **({"words": spoken} if words else {})}

    def synthesize(self, text: str, *, speed: float = 1.0, speaker: int | None = None,
                   ticket: Any = None) -> Any:
        """One piece of speech (float32 samples at ``self.rate``); none once ``ticket`` is
        cancelled."""
        import numpy as np

        with self._lock:
            self._ready()
            if ticket is not None:
                ticket.check()
            config = self.model.model.config
            forward: dict[str, Any] = {}
            if speaker is not None:
                forward["speaker_id"] = speaker
            before = getattr(config, "speaking_rate", None)
            if before is not None:
                config.speaking_rate = speed
            try:
                out = self.model(text, forward_params=forward) if forward \
                    else self.model(text)
            finally:
                if before is not None:
                    config.speaking_rate = before
        return np.asarray(out["audio"], dtype=np.float32).reshape(-1)

    @property
    def sets_speed(self) -> bool:
        return hasattr(self.model.model.config, "speaking_rate")

    def _ready(self) -> None:
        if self.state != "ready":
            raise NotLoaded(self.state)

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def _lengths(self, texts: list[str] | list[tuple[str, str]]) -> list[int]:
        if texts and isinstance(texts[0], tuple):
            encoded = self.tokenizer([q for q, _ in texts], [d for _, d in texts],
                                     truncation=True, max_length=self.max_tokens)
        else:
            encoded = self.tokenizer(texts, truncation=True, max_length=self.max_tokens)
        return [len(ids) for ids in encoded["input_ids"]]

    def embed(self, texts: list[str]) -> list[tuple[Any, int]]:
        """Each text's vector and its token count, for one batch."""
        with self._lock:
            self._ready()
            vectors = self.model.encode(texts, batch_size=self.options.batch_size,
                                        convert_to_numpy=True, normalize_embeddings=False,
                                        show_progress_bar=False)
            lengths = self._lengths(texts)
        return list(zip(vectors.astype("float32"), lengths, strict=True))

    def rerank(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]:
        """Each (query, document) pair's score and its token count, for one batch."""
        with self._lock:
            self._ready()
            scores = self.model.predict(pairs, batch_size=self.options.batch_size,
                                        show_progress_bar=False, convert_to_numpy=True)
            lengths = self._lengths(pairs)
        return [(float(s), n) for s, n in zip(scores, lengths, strict=True)]

    def offload(self) -> dict[str, Any]:
        return self._move("cpu", "ready", "offloaded")

    def onload(self) -> dict[str, Any]:
        return self._move(self.device, "offloaded", "ready")

    def _move(self, device: str, source: str, target: str) -> dict[str, Any]:
        import torch

        with self._lock:
            if self.state == target:
                return {"state": self.state, "seconds": 0.0}
            if self.state != source:
                raise NotLoaded(self.state)
            started = time.perf_counter()
            # a pipeline's model moves; the pipeline keeps sending inputs to self.device,
            # which is where the model is whenever a request runs (none runs parked). A split
            # model moves its resident part: its streamed blocks and their hooks stay as they are
            if self.layers is not None:
                place_resident(self._module(torch), device, self.layers)
            else:
                self._module(torch).to(device)
            if device == "cpu" and torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.state = target
            return {"state": self.state, "seconds": round(time.perf_counter() - started, 4)}

    def _module(self, torch: Any) -> Any:
        """The torch module that holds the weights (a pipeline's or CrossEncoder's model)."""
        model = self.model
        return model if isinstance(model, torch.nn.Module) else model.model

    def report(self) -> dict[str, Any]:
        """``GET /health``: the state, and what the coordinator learns the model's size from
        (CUDA's figures on a GPU; the weights' size everywhere)."""
        speech = {"sampling_rate": self.rate} if self.rate else {}
        return {"state": self.state, "error": self.error, "task": self.options.task,
                "model": self.options.model, "device": self.device,
                "tier": "cpu" if self.state == "offloaded" else
                ("gpu" if self.device == "cuda" else "cpu"),
                "dimensions": self.dimensions, "max_tokens": self.max_tokens,
                "loads_from_disk": 1 if self.footprint_mb is not None else 0,
                "load_s": self.load_s, "footprint_mb": self.footprint_mb,
                "gpu_layers": self.layers.resident if self.layers else None,
                "total_layers": self.layers.total if self.layers else None,
                "offload_prefetch": self.layers.prefetch if self.layers else None,
                "memory": _cuda_memory() if self.device == "cuda" else {}, **speech}
