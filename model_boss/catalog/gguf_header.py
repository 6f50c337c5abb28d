"""Reading a GGUF file's metadata keys without its tensors: what discovery needs to serve a
file (architecture, trained context, pooling, splits) and what the VRAM estimate reads."""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# llama.cpp's LLAMA_POOLING_TYPE_*: what ``{arch}.pooling_type`` holds
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
# the vocabulary: tens of thousands of strings, written after the model's own keys
VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.scores")


@cache
def gguf_tables() -> ModuleType:
    """The ``gguf`` package's type tables (``gguf.constants``: quantisation block sizes, file
    types), loaded alone: importing the package loads numpy and its writer too, a tenth of a
    second of every coordinator's start for two tables."""
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("gguf")
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    source = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location("model_boss._gguf_constants", source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {source}")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    return tables


class HeaderReader:
    """A streaming reader of a GGUF header. Arrays are skipped and only their length kept
    (``gguf.GGUFReader`` parses every array into numpy: seconds for a large vocabulary)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        # no length in a header can be past the end of the file: a corrupt one is refused
        # instead of read into memory
        self.size = os.fstat(handle.fileno()).st_size

    def length(self) -> int:
        value = self.unpack("<Q")
        if value > self.size:
            raise ValueError(f"corrupt GGUF header (a length of {value} in a file of "
                             f"{self.size} bytes)")
        return value

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.handle.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        return self.handle.read(self.length()).decode(errors="replace")

    def value(self, kind: int) -> Any:
        if kind in SCALARS:
            return self.unpack(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            inner, count = self.unpack("<I"), self.length()
            if inner in SCALARS:
                self.handle.seek(count * struct.calcsize(SCALARS[inner]), 1)
            elif inner == STRING:
                for _ in range(count):
                    self.handle.seek(self.length(), 1)
            else:
                for _ in range(count):
                    self.value(inner)
            return count  # arrays: only their length is kept
        raise ValueError(f"unknown GGUF value type {kind}")

    def begin(self) -> tuple[int, int]:
        """Check the magic; the counts of tensors and of metadata keys."""
        if self.handle.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        self.unpack("<I")  # version
        return self.length(), self.length()

    def metadata(self, count: int, *, stop_at_vocabulary: bool = False) -> dict[str, Any]:
        """The next ``count`` keys. ``stop_at_vocabulary``: stop at the tokenizer's big arrays
        once the architecture is known (the model's own keys come before them)."""
        meta: dict[str, Any] = {}
        for _ in range(count):
            key = self.string()
            if stop_at_vocabulary and key in VOCABULARY_KEYS and "general.architecture" in meta:
                break
            meta[key] = self.value(self.unpack("<I"))
        return meta


def read_metadata(path: Path, *, stop_at_vocabulary: bool = True) -> dict[str, Any]:
    """The metadata keys of the GGUF file at ``path`` (ValueError when it is not one)."""
    with open(path, "rb", buffering=64 * 1024) as handle:
        reader = HeaderReader(handle)
        _, keys = reader.begin()
        return reader.metadata(keys, stop_at_vocabulary=stop_at_vocabulary)


def pooling_of(meta: dict[str, Any]) -> str | None:
    """The pooling a GGUF declares (``mean``, ``cls``, ``last``, ``rank``), or None."""
    arch = meta.get("general.architecture", "")
    value = meta.get(f"{arch}.pooling_type")
    return POOLING.get(value) if isinstance(value, int) else None
