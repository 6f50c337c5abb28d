"""What a GGUF file says about its VRAM needs, read with the ``gguf`` package."""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

UBATCH = 512          # llama.cpp's default micro-batch: the compute buffer scales with it
FIXED_COMPUTE_MB = 64  # scratch llama.cpp allocates whatever the model


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    architecture: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    head_dim: int
    vocab_size: int
    context_length: int
    total_bytes: int
    block_bytes: tuple[int, ...]

    @property
    def other_bytes(self) -> int:
        """Weights outside the repeating blocks: embeddings, output head, norms."""
        return self.total_bytes - sum(self.block_bytes)

    def kv_bytes(self, ctx: int, layers: int | None = None) -> int:
        """f16 K and V for ``ctx`` tokens over ``layers`` blocks (all by default)."""
        n = self.block_count if layers is None else layers
        return 2 * n * ctx * self.head_count_kv * self.head_dim * 2

    def compute_bytes(self) -> int:
        """Activations and logits for one micro-batch, plus fixed scratch."""
        per_token = (self.vocab_size + 4 * self.embedding_length + self.feed_forward_length) * 4
        return UBATCH * per_token + FIXED_COMPUTE_MB * 2**20


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Header:
    """A streaming reader of the GGUF header: metadata and tensor infos, no tensor data.

    ``gguf.GGUFReader`` parses every array into numpy (seconds for a large vocabulary);
    this reads only what the estimate needs and skips the rest, using the ``gguf`` package's
    own type tables for tensor sizes."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.handle.read(size))[0]

    def string(self) -> str:
        return self.handle.read(self.unpack("<Q")).decode(errors="replace")

    def value(self, kind: int, keep: bool = True):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if inner in _SCALARS:
                self.handle.seek(count * struct.calcsize(_SCALARS[inner]), 1)
            else:
                for _ in range(count):
                    self.value(inner, keep=False)
            return count  # arrays: only their length is kept
        raise ValueError(f"unknown GGUF value type {kind}")


@lru_cache(maxsize=64)
def _read(path: str, _mtime: float) -> GGUFInfo:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as handle:
        header = _Header(handle)
        if handle.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        header.unpack("<I")  # version
        tensors, kvs = header.unpack("<Q"), header.unpack("<Q")
        meta = {}
        for _ in range(kvs):
            key = header.string()
            meta[key] = header.value(header.unpack("<I"))
        arch = meta.get("general.architecture", "llama")
        blocks = int(meta.get(f"{arch}.block_count", 0))
        per_block = [0] * blocks
        total = 0
        for _ in range(tensors):
            name = header.string()
            dims = [header.unpack("<Q") for _ in range(header.unpack("<I"))]
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(header.unpack("<I"))]
            header.unpack("<Q")  # offset
            count = 1
            for dim in dims:
                count *= dim
            size = count * type_size // block
            total += size
            parts = name.split(".")
            if parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < blocks:
                per_block[int(parts[1])] += size
    emb = int(meta.get(f"{arch}.embedding_length", 0))
    heads = int(meta.get(f"{arch}.attention.head_count", 1) or 1)
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads) or heads)
    return GGUFInfo(
        architecture=arch, block_count=blocks, embedding_length=emb,
        feed_forward_length=int(meta.get(f"{arch}.feed_forward_length", 0) or 0),
        head_count=heads, head_count_kv=kv_heads,
        head_dim=int(meta.get(f"{arch}.attention.key_length", 0) or (emb // heads)),
        vocab_size=int(meta.get("tokenizer.ggml.tokens", 32000)),
        context_length=int(meta.get(f"{arch}.context_length", 0) or 0),
        total_bytes=total, block_bytes=tuple(per_block))


def read_gguf_info(path: Path) -> GGUFInfo | None:
    """Parsed metadata (cached per path and mtime), or None when the file is not GGUF."""
    try:
        return _read(str(path), path.stat().st_mtime)
    except Exception as exc:  # a truncated or foreign file: fall through to the next rung
        log.debug("cannot read GGUF metadata from %s: %s", path, exc)
        return None


def layer_costs_mb(info: GGUFInfo, ctx: int) -> tuple[float, float]:
    """(MB per offloaded layer: weights + its KV, MB that stay on the GPU regardless)."""
    per_layer = (sum(info.block_bytes) / max(1, info.block_count)
                 + info.kv_bytes(ctx, 1)) / 2**20
    fixed = (info.other_bytes + info.compute_bytes()) / 2**20
    return per_layer, fixed
