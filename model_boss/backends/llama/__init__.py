"""llama.cpp's server as a worker: native (xllamacpp), an external binary, or
llama-cpp-python; chat templates rendered here when a manifest names one; whole answers
gathered from streams; the server's own report."""

from .cpp_python import LlamaCppPythonBackend
from .server import (
    BinaryLlamaBackend,
    LlamaCppServerBackend,
    LlamaServerBackend,
    NativeLlamaBackend,
    template_file,
)

__all__ = ["BinaryLlamaBackend", "LlamaCppPythonBackend", "LlamaCppServerBackend",
           "LlamaServerBackend", "NativeLlamaBackend", "template_file"]
