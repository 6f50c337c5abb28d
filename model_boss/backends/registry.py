"""BACKENDS: the worker kinds the pool can start, by manifest ``backend``."""

from ..catalog import BackendKind, CatalogEntry
from ..catalog.extras import default_llama_worker
from ..catalog.manifest import LlamaWorker, ModelManifest
from ..settings import Settings
from .cloud import CloudBackend
from .command import CommandBackend
from .diffusers import DiffusersBackend
from .llama import (
    BinaryLlamaBackend,
    LlamaCppPythonBackend,
    LlamaCppServerBackend,
    LlamaServerBackend,
    NativeLlamaBackend,
)
from .transformers import TransformersBackend


def worker_kind(manifest: ModelManifest, settings: Settings) -> LlamaWorker:
    """The manifest's ``worker``, else the settings' default, else binary when a
    ``llama_server_binary`` is configured, else native."""
    return manifest.worker if manifest.worker is not None else default_llama_worker(settings)


class LlamaBackends:
    """The pool's factory for ``backend: llama-server``: the class of the manifest's kind."""

    choices_per_request = LlamaServerBackend.choices_per_request
    refuses = LlamaServerBackend.refuses

    def __call__(self, entry: CatalogEntry, settings: Settings) -> LlamaServerBackend:
        kinds: dict[LlamaWorker, type[LlamaServerBackend]] = {
            LlamaWorker.NATIVE: NativeLlamaBackend,
            LlamaWorker.BINARY: BinaryLlamaBackend,
            LlamaWorker.LLAMA_CPP_PYTHON: LlamaCppPythonBackend,
        }
        return kinds[worker_kind(entry.manifest, settings)](entry, settings)


BACKENDS: dict = {
    BackendKind.LLAMA_SERVER: LlamaBackends(),  # native | binary | llama-cpp-python
    BackendKind.DIFFUSERS: DiffusersBackend,
    BackendKind.COMMAND: CommandBackend,
    BackendKind.CLOUD: CloudBackend,
    BackendKind.TRANSFORMERS: TransformersBackend,
}

__all__ = ["BACKENDS", "BinaryLlamaBackend", "CloudBackend", "CommandBackend",
           "DiffusersBackend", "LlamaBackends", "LlamaCppPythonBackend", "LlamaCppServerBackend",
           "LlamaServerBackend", "NativeLlamaBackend", "TransformersBackend", "worker_kind"]
