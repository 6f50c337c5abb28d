"""The model: a sentence-transformers embedder or a CrossEncoder reranker, loaded from a local
folder as the library loads a downloaded one; moved between the device and CPU RAM."""

from __future__ import annotations

import logging
import threading
from typing import Any

from .options import WorkerOptions

log = logging.getLogger(__name__)


class NotLoaded(RuntimeError):
    """The model is loading, failed to load, or is parked in CPU RAM."""


class Engine:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.model: Any = None
        self.state = "loading"  # loading | ready | offloaded | failed
        self.error: str | None = None
        self.device = "cpu"
        self.dimensions: int | None = None
        self.max_tokens: int | None = None
        self._lock = threading.Lock()  # one model call or move at a time

    def load(self) -> None:
        import torch
        from sentence_transformers import CrossEncoder, SentenceTransformer

        try:
            wanted = self.options.device
            self.device = ("cuda" if torch.cuda.is_available() else "cpu") \
                if wanted == "auto" else wanted
            kwargs: dict[str, Any] = {"device": self.device, "local_files_only": True}
            if self.options.dtype != "auto":
                kwargs["model_kwargs"] = {"torch_dtype": getattr(torch, self.options.dtype)}
            if self.options.task == "embedding":
                self.model = SentenceTransformer(self.options.model, **kwargs)
                dimension = getattr(self.model, "get_embedding_dimension", None) or \
                    self.model.get_sentence_embedding_dimension
                self.dimensions = dimension()
                self.max_tokens = self.model.max_seq_length
            else:
                self.model = CrossEncoder(self.options.model, **kwargs)
                self.max_tokens = self.model.max_length
            self.state = "ready"
            log.info("loaded %s (%s) on %s", self.options.model, self.options.task, self.device)
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("loading %s failed", self.options.model)

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

    def embed(self, texts: list[str]) -> list[tuple[list[float], int]]:
        """Each text's vector and its token count, for one batch."""
        with self._lock:
            self._ready()
            vectors = self.model.encode(texts, batch_size=self.options.batch_size,
                                        convert_to_numpy=True, normalize_embeddings=False,
                                        show_progress_bar=False)
            lengths = self._lengths(texts)
        return [(v.astype("float32").tolist(), n) for v, n in zip(vectors, lengths, strict=True)]

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
        import time

        import torch

        with self._lock:
            if self.state == target:
                return {"state": self.state, "moved_s": 0.0}
            if self.state != source:
                raise NotLoaded(self.state)
            started = time.perf_counter()
            self.model.to(device)
            if device == "cpu" and torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.state = target
            return {"state": self.state, "moved_s": round(time.perf_counter() - started, 3)}

    def report(self) -> dict[str, Any]:
        return {"state": self.state, "error": self.error, "task": self.options.task,
                "device": self.device, "tier": "cpu" if self.state == "offloaded" else
                ("gpu" if self.device == "cuda" else "cpu"),
                "dimensions": self.dimensions, "max_tokens": self.max_tokens}
