"""LlamaCppPythonBackend: ``python -m llama_cpp.server`` (the optional ``llama-cpp-python``
extra, compiled from source at install)."""

from __future__ import annotations

import importlib.util
import sys

from ...errors import LoadFailed
from ...gpu.placement import Placement
from .chat_templates import uses_prompt_template
from .server import LlamaServerBackend


def llama_cpp_python_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppPythonBackend(LlamaServerBackend):
    """llama-cpp-python's server: its own flag names, the API key in ``API_KEY`` (its
    settings read the environment), ready when ``/v1/models`` answers. Chat templates other
    than the worker's own (a name or a Jinja file too) are rendered here."""

    secret_env = "API_KEY"
    health_path = "/v1/models"

    def renders_template(self) -> bool:
        return uses_prompt_template(self.manifest.chat_template)

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        if not llama_cpp_python_installed():
            raise LoadFailed("worker: llama-cpp-python needs the optional extra "
                             "(pip install -e '.[llama-cpp-python]')")
        m = self.manifest
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.entry.path),
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(m.ctx_size),
                "--n_gpu_layers", str(self.gpu_layers(placement)),
                "--interrupt_requests", "False", "--model_alias", m.id]
        split = self.tensor_split(placement)
        if split:
            argv += ["--tensor_split", *[f"{r:g}" for r in split]]
        if m.main_gpu is not None:
            argv += ["--main_gpu", str(m.main_gpu)]
        if m.flash_attention == "on":
            argv += ["--flash_attn", "True"]
        if m.threads:
            argv += ["--n_threads", str(m.threads)]
        if m.embeddings:
            argv += ["--embedding", "True"]
        return argv + list(m.args)
