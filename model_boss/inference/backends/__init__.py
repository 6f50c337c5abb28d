"""Worker kinds the pool can start, by manifest ``backend``."""

from ...catalog import BackendKind
from .cloud import CloudBackend
from .command import CommandBackend
from .diffusers import DiffusersBackend
from .llama import LlamaServerBackend

BACKENDS: dict = {
    BackendKind.LLAMA_SERVER: LlamaServerBackend,
    BackendKind.DIFFUSERS: DiffusersBackend,
    BackendKind.COMMAND: CommandBackend,
    BackendKind.CLOUD: CloudBackend,
}

__all__ = ["BACKENDS", "CloudBackend", "CommandBackend", "DiffusersBackend", "LlamaServerBackend"]
