"""Worker kinds the pool can start, by manifest ``backend``."""

from ...catalog import BackendKind
from .llama import LlamaServerBackend

BACKENDS: dict = {
    BackendKind.LLAMA_SERVER: LlamaServerBackend,
}

__all__ = ["BACKENDS", "LlamaServerBackend"]
