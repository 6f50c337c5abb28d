"""Worker kinds the pool can start, by manifest ``backend``."""

from ...catalog import BackendKind
from .diffusers import DiffusersBackend
from .llama import LlamaServerBackend

BACKENDS: dict = {
    BackendKind.LLAMA_SERVER: LlamaServerBackend,
    BackendKind.DIFFUSERS: DiffusersBackend,
}

__all__ = ["BACKENDS", "DiffusersBackend", "LlamaServerBackend"]
