"""LlamaServerBackend: the llama.cpp server, as a ``llama-server`` binary or llama-cpp-python."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from ...gpu.placement import Placement
from ..backend import HttpWorkerBackend, UpstreamResponse
from .chat_templates import as_chat, completion_request, uses_prompt_template


class LlamaServerBackend(HttpWorkerBackend):
    """Runs ``llama-server`` when configured (or on PATH and asked for), else
    ``python -m llama_cpp.server``; context size, GPU layers, tensor split and parallel slots
    come from the manifest and the placement. A manifest ``chat_template`` other than the
    worker's own (alpaca, raw, a Jinja file) is applied here: chat requests are rendered into
    a prompt for ``/v1/completions`` and the answer is turned back into a chat completion."""

    # llama.cpp's server answers one choice per request; more is refused up front (400)
    choices_per_request = 1

    def binary(self) -> str | None:
        configured = self.settings.llama_server_binary
        if not configured:
            return None
        return shutil.which(configured) or configured

    @property
    def health_path(self) -> str:  # type: ignore[override]
        return "/health" if self.binary() else "/v1/models"

    def gpu_layers(self, placement: Placement | None) -> int:
        if placement is None or not placement.gpus:
            return 0
        if placement.gpu_layers is not None:
            return placement.gpu_layers
        layers = self.manifest.gpu_layers
        return -1 if layers == "auto" else int(layers)

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        m = self.manifest
        model = str(self.entry.path)
        layers = self.gpu_layers(placement)
        split = list(placement.tensor_split) if placement and placement.kind == "split" else []
        binary = self.binary()
        if binary:
            argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                    "-c", str(m.ctx_size), "-ngl", str(999 if layers < 0 else layers),
                    "--parallel", str(m.concurrency)]
            if split:
                argv += ["--tensor-split", ",".join(f"{r:g}" for r in split)]
            if m.flash_attn:
                argv += ["-fa", "on"]
            if m.threads:
                argv += ["-t", str(m.threads)]
        else:
            argv = [sys.executable, "-m", "llama_cpp.server", "--model", model,
                    "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(m.ctx_size),
                    "--n_gpu_layers", str(layers), "--interrupt_requests", "False",
                    "--model_alias", m.id]
            if split:
                argv += ["--tensor_split", *[f"{r:g}" for r in split]]
            if m.flash_attn:
                argv += ["--flash_attn", "True"]
            if m.threads:
                argv += ["--n_threads", str(m.threads)]
        return argv + list(m.args)

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        template = self.manifest.chat_template
        if endpoint != "/v1/chat/completions" or not uses_prompt_template(template):
            return await super().handle_request(endpoint, body, stream)
        source = self.manifest.source_file
        completion = completion_request(body, template or "",
                                        Path(source).parent if source else None)
        return as_chat(await super().handle_request("/v1/completions", completion, stream))
