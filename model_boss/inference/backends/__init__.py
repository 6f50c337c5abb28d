"""Worker kinds the pool can start, by manifest ``backend``."""

from ...catalog import BackendKind
from .command import CommandBackend
from .diffusers import DiffusersBackend
from .llama import LlamaServerBackend

BACKENDS: dict = {
    BackendKind.LLAMA_SERVER: LlamaServerBackend,
    BackendKind.DIFFUSERS: DiffusersBackend,
    BackendKind.COMMAND: CommandBackend,
}

__all__ = ["BACKENDS", "CommandBackend", "DiffusersBackend", "LlamaServerBackend"]
