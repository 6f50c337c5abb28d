"""LlamaServerBackend: a GGUF model behind llama.cpp's server, in one of three worker kinds.

``native`` (the default) runs ``python -m workers.llama``: llama.cpp's own HTTP server
in-process through the ``xllamacpp`` wheel. ``binary`` runs an external ``llama-server`` (a
CUDA / ROCm build) with the same flags. ``llama-cpp-python`` runs ``python -m
llama_cpp.server`` (``llama_cpp_python.py``; an optional extra). The manifest's ``worker``
picks one, else ``settings.llama_worker``, else ``binary`` when ``llama_server_binary`` is
set and ``native`` otherwise.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx

from ...catalog.context import explain_overflow
from ...catalog.manifest import ModelManifest
from ...errors import LoadFailed, ModelBossError
from ...gpu.placement import Placement, layers_on_gpu
from ..base import HttpWorkerBackend, UpstreamResponse
from .chat_templates import as_chat, completion_request
from .collect import as_stream, collectable, gather
from .fingerprint import rewrite, rewrite_stream
from .prompt_cache import PromptCache
from .report import kv_cache_ratio, parse_metrics, server_report

ALL_LAYERS = 999  # "every layer" in a form every llama-server version takes
MODEL_SIDE_TEMPLATES = ("alpaca", "raw")  # rendered here: llama.cpp has no such template
_REPO_ROOT = Path(__file__).resolve().parents[3]  # where the ``workers`` package lives


class LlamaServerBackend(HttpWorkerBackend):
    """What every llama worker kind shares: GPU layers and split from the placement, the
    prompt templates rendered here (chat → ``/v1/completions`` → chat), and reports."""

    # llama.cpp's server answers one choice per request; more is refused up front (400)
    choices_per_request = 1
    health_path = "/health"
    # what only other kinds of worker answer, refused before a load (llama.cpp's server would
    # be loaded to answer 404 "File Not Found" for images, or that the model takes no audio)
    refuses = frozenset({"/v1/audio/speech", "/v1/audio/transcriptions",
                         "/v1/audio/translations", "/v1/images/generations",
                         "/v1/images/edits", "/v1/videos"})

    def gpu_layers(self, placement: Placement | None) -> int:
        """Layers on the GPU: 0 without one, the pool's count for a partial offload, else the
        manifest's (``auto`` = all, -1)."""
        return layers_on_gpu(placement, self.manifest.gpu_layers)

    @staticmethod
    def tensor_split(placement: Placement | None) -> list[float]:
        return list(placement.tensor_split) if placement and placement.kind == "split" else []

    def renders_template(self) -> bool:
        """Whether chat requests are rendered into a prompt here rather than by the worker."""
        return self.manifest.chat_template in MODEL_SIDE_TEMPLATES

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        if endpoint != "/v1/chat/completions" or not self.renders_template():
            return await super().handle_request(endpoint, body, stream)
        source = self.manifest.source_file
        completion = completion_request(body, self.manifest.chat_template or "",
                                        Path(source).parent if source else None)
        return as_chat(await super().handle_request("/v1/completions", completion, stream))

    async def report(self) -> dict[str, Any]:
        """The server's own ``/props``, ``/slots`` and ``/metrics``, and the process's RSS."""
        if self._client is None:
            return {}
        return await server_report(self._client, self.pid)

    async def kv_cache_usage(self) -> float | None:
        """``llamacpp:kv_cache_usage_ratio`` from the server's ``/metrics`` (one short GET; a
        ``llama-cpp-python`` worker, or a build without it, has none)."""
        if self._client is None:
            return None
        return await kv_cache_ratio(self._client)


class LlamaCppServerBackend(LlamaServerBackend):
    """llama.cpp's own server (native or binary): one flag per manifest field, the API key in
    ``LLAMA_API_KEY`` (which ``llama-server`` reads), ``/health`` 200 once the model is in;
    its slots' prompt caches saved on a planned stop and restored at the next load
    (:mod:`.prompt_cache`)."""

    secret_env = "LLAMA_API_KEY"
    # its /v1/responses events come without OpenAI's sequence numbers and indexes (told on
    # the way back: services/responses); its slots take a request's id_slot
    llama_responses = True
    prompt_cache: PromptCache | None = None  # the pool's
    _shelf: Path | None = None

    def build_id(self) -> str:
        """What identifies the llama.cpp build (a saved KV cache is only valid for it)."""
        return "unknown"

    def cache_shelf(self) -> Path | None:
        """This load's folder of saved slots, or None when prompts are not kept (off, or a
        model that generates nothing: an embedder or a reranker)."""
        m, cache = self.manifest, self.prompt_cache
        if cache is None or not cache.enabled or m.embeddings or m.reranking or m.pooling \
                or self.entry.path is None:
            return None
        model = Path(self.entry.path).resolve()
        stat = model.stat()
        return cache.shelf(m.id, {
            "model": str(model), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "ctx_size": m.ctx_size, "parallel": m.concurrency, "cache_type_k": m.cache_type_k,
            "cache_type_v": m.cache_type_v, "flash_attn": m.flash_attn,
            "mmproj": m.mmproj, "build": self.build_id()})

    async def start(self, port: int, placement: Placement | None) -> None:
        """Start, then put back the slots saved when the model last left (before any request
        runs: the slot is LOADING until this returns)."""
        await super().start(port, placement)
        if self._shelf is not None and self.prompt_cache is not None and self._client:
            await self.prompt_cache.restore(self._client, self._shelf, self.manifest.id,
                                            self.manifest.concurrency)

    async def retire(self) -> None:
        """A planned stop (eviction, unload, shutdown): save the slots' prompts first, and
        keep the worker's count of prompt tokens it reused from its caches."""
        if self._shelf is not None and self.prompt_cache is not None and self._client \
                and self.alive:
            await self.prompt_cache.save(self._client, self._shelf, self.manifest.id)
            with contextlib.suppress(httpx.HTTPError, ValueError):
                reply = await self._client.get("/metrics", timeout=2.0)
                reused = parse_metrics(reply.text).get("prompt_tokens_cached_total")
                if reply.status_code == 200 and reused is not None:
                    self.prompt_cache.note_reused(self.manifest.id, int(reused))

    @property
    def speaks_anthropic(self) -> bool:
        """llama.cpp's server answers ``/v1/messages`` itself, with its own chat template (a
        template rendered here needs the chat translation)."""
        return not self.renders_template()

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        """A non-streamed generation is asked for as a stream and gathered here: llama.cpp's
        server stops a stream whose caller went away, but not a whole answer
        (:mod:`.llama_collect`). A prompt longer than the context is refused saying the
        model's context and the field that sets it."""
        try:
            if stream or not collectable(endpoint, body):
                return self.fingerprinted(await super().handle_request(endpoint, body, stream))
            upstream = await super().handle_request(endpoint, as_stream(endpoint, body), True)
            return await gather(endpoint, self.fingerprinted(upstream), self.manifest.id)
        except ModelBossError as exc:
            explain_overflow(exc, self.manifest)
            raise

    def llama_build(self) -> str | None:
        """The llama.cpp build, for answers whose server says only ``b0-unknown``; None: not
        known here (the field is then null)."""
        return None

    def fingerprinted(self, upstream: UpstreamResponse) -> UpstreamResponse:
        """``upstream`` with an unknown ``system_fingerprint`` told (:mod:`.fingerprint`)."""
        build = self.llama_build()
        if upstream.stream is not None:
            upstream.stream = rewrite_stream(upstream.stream, build)
        elif upstream.body:
            upstream.body = rewrite(upstream.body, build)
        return upstream
    # llama.cpp's server says when it starts on the weights and when they are in (the
    # threadpool comes up right before its warm-up run); its /health says only "Loading
    # model" until the end, so no fraction
    log_stages = (("loading model", "loading"), ("llama threadpool init", "warming"),
                  ("warming up the model", "warming"))

    def request_headers(self, stream: bool) -> dict[str, str]:
        # llama.cpp's server closes the connection after a stream although it answered
        # keep-alive: a pooled reuse of it fails, so a stream's connection is not pooled
        headers = super().request_headers(stream)
        return {**headers, "Connection": "close"} if stream else headers

    def server_flags(self, port: int, placement: Placement | None) -> list[str]:
        """``llama-server``'s flags for this manifest and placement."""
        m = self.manifest
        layers = self.gpu_layers(placement)
        flags = ["--model", str(self.entry.path), "--host", "127.0.0.1", "--port", str(port),
                 "--ctx-size", str(m.ctx_size),
                 "--n-gpu-layers", str(ALL_LAYERS if layers < 0 else layers),
                 "--parallel", str(m.concurrency), "--alias", m.id, "--metrics"]
        split = self.tensor_split(placement)
        if split:
            flags += ["--tensor-split", ",".join(f"{r:g}" for r in split)]
        if m.main_gpu is not None:
            flags += ["--main-gpu", str(m.main_gpu)]
        if m.threads:
            flags += ["--threads", str(m.threads)]
        if m.flash_attention != "auto":
            flags += ["--flash-attn", m.flash_attention]
        if m.cache_type_k != "f16":
            flags += ["--cache-type-k", m.cache_type_k]
        if m.cache_type_v != "f16":
            flags += ["--cache-type-v", m.cache_type_v]
        flags += self.template_flags()
        if m.mmproj:  # relative: beside the model file
            flags += ["--mmproj", str(Path(self.entry.path or ".").parent / m.mmproj)]
        if m.embeddings:
            flags.append("--embeddings")
        if m.pooling:
            flags += ["--pooling", m.pooling]
        if m.reranking:
            flags.append("--reranking")
        flags += self.companion_flags()
        # with adapters, no prompt cache outlives a request: llama.cpp keys its caches by
        # tokens alone, not by the adapters a request applied (catalog/adapters.py)
        self._shelf = None if self.entry.adapters else self.cache_shelf()
        if self._shelf is not None:
            flags += ["--slot-save-path", str(self._shelf)]
        cache_ram = 0 if self.entry.adapters else m.cache_ram_mb if m.cache_ram_mb is not None \
            else self.settings.llama_cache_ram_mb
        if cache_ram is not None:
            flags += ["--cache-ram", str(cache_ram)]
        return flags

    def companion_flags(self) -> list[str]:
        """Its adapters, loaded and applied to no request unless it asks (llama.cpp's
        per-request ``lora``, by their order here), and its draft model."""
        m = self.manifest
        flags = [flag for adapter in self.entry.adapters for flag in ("--lora", str(adapter.path))]
        if flags:
            flags.append("--lora-init-without-apply")
        if m.draft:
            flags += ["--model-draft", str(m.resolved_draft(self.settings.models_path))]
            for flag, value in (("--draft-max", m.draft_max), ("--draft-min", m.draft_min),
                                ("--draft-p-min", m.draft_p_min)):
                if value is not None:
                    flags += [flag, f"{value:g}"]
        return flags

    def template_flags(self) -> list[str]:
        """A template name → ``--chat-template``; a Jinja file (relative to the manifest) →
        ``--chat-template-file``; unset or ``native`` → the GGUF's own."""
        template = self.manifest.chat_template
        if not template or template == "native" or self.renders_template():
            return []
        path = template_file(self.manifest)
        if path is not None:
            return ["--chat-template-file", str(path)]
        return ["--chat-template", template]


class NativeLlamaBackend(LlamaCppServerBackend):
    """``python -m workers.llama``: llama.cpp's server in-process through ``xllamacpp``."""

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        try:
            import xllamacpp  # noqa: F401  (only to fail here, with a clear message)
        except ImportError as exc:
            raise LoadFailed("the native llama worker needs the 'xllamacpp' package "
                             "(pip install -e '.[llama]')") from exc
        return [sys.executable, "-m", "workers.llama", *self.server_flags(port, placement),
                "--parent-pid", str(os.getpid()), *self.manifest.args]

    def environment(self, placement: Placement | None) -> dict[str, str]:
        env = super().environment(placement)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
        return env

    def build_id(self) -> str:
        try:
            return "xllamacpp " + importlib.metadata.version("xllamacpp")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    def llama_build(self) -> str | None:
        """The wheel's version: it pins the llama.cpp it was built from (whose own build
        number and commit the wheel leaves at ``b0-unknown``)."""
        built = self.build_id()
        return None if built == "unknown" else built.replace(" ", "-")


class BinaryLlamaBackend(LlamaCppServerBackend):
    """An external ``llama-server`` (``settings.llama_server_binary``, else from PATH)."""

    def binary(self) -> str:
        configured = self.settings.llama_server_binary or "llama-server"
        found = shutil.which(configured)
        if found is None:
            raise LoadFailed(f"llama-server binary not found: {configured} (set "
                             "llama_server_binary, or use worker: native)")
        return found

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        return [self.binary(), *self.server_flags(port, placement), *self.manifest.args]

    def build_id(self) -> str:
        binary = Path(self.binary()).resolve()
        stat = binary.stat()
        return f"{binary} {stat.st_size} {stat.st_mtime_ns}"


def template_file(manifest: ModelManifest) -> Path | None:
    """The Jinja file ``chat_template`` names (relative to the manifest's directory), or None
    when it names a template instead."""
    template = manifest.chat_template or ""
    path = Path(template).expanduser()
    if not path.is_absolute() and manifest.source_file:
        path = Path(manifest.source_file).parent / path
    looks_like_file = template.endswith((".jinja", ".j2")) or os.sep in template
    if path.is_file() or looks_like_file:
        return path
    return None
