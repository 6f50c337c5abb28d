"""Worker kinds the pool can start, by manifest ``backend``."""

from ...catalog import BackendKind
from .cloud import CloudBackend
from .command import CommandBackend
from .diffusers import DiffusersBackend
from .llama import (
    BinaryLlamaBackend,
    LlamaBackends,
    LlamaCppServerBackend,
    LlamaServerBackend,
    NativeLlamaBackend,
    worker_kind,
)
from .llama_cpp_python import LlamaCppPythonBackend

BACKENDS: dict = {
    BackendKind.LLAMA_SERVER: LlamaBackends(),  # native | binary | llama-cpp-python
    BackendKind.DIFFUSERS: DiffusersBackend,
    BackendKind.COMMAND: CommandBackend,
    BackendKind.CLOUD: CloudBackend,
}

__all__ = ["BACKENDS", "BinaryLlamaBackend", "CloudBackend", "CommandBackend",
           "DiffusersBackend", "LlamaBackends", "LlamaCppPythonBackend", "LlamaCppServerBackend",
           "LlamaServerBackend", "NativeLlamaBackend", "worker_kind"]
