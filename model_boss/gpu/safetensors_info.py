"""What a transformers folder's safetensors headers tell without loading a tensor: the bytes of
its weights, and its repeated blocks (the decoder layers) for a partial GPU offload. Pure
reads of the JSON headers; a file that cannot be read counts as nothing."""

from __future__ import annotations

import json
import re
import struct
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# a tensor in a numbered block: "model.layers.12.self_attn.q_proj.weight" → ("model.layers", 12)
_BLOCK = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)\.")
_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)  # "self_attn.q_proj", "attention.self"


def read_headers(path: Path) -> dict[str, int]:
    """Each tensor's name and bytes, over a .safetensors file or a folder of them."""
    files = [path] if path.is_file() else sorted(path.rglob("*.safetensors")) \
        if path.is_dir() else []
    sizes: dict[str, int] = {}
    for file in files:
        if file.suffix != ".safetensors":
            continue
        try:
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
            for name, meta in header.items():
                if name != "__metadata__":
                    start, end = meta["data_offsets"]
                    sizes[f"{file.name}:{name}"] = end - start
        except (OSError, ValueError, struct.error, KeyError, TypeError):
            continue
    return sizes


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """The model's repeated blocks: where they are (``prefix``), how many, the bytes of each,
    and the bytes of everything else (embeddings, heads, the other parts)."""

    prefix: str
    block_bytes: tuple[int, ...]
    other_bytes: int

    @property
    def count(self) -> int:
        return len(self.block_bytes)

    @property
    def largest_block(self) -> int:
        return max(self.block_bytes, default=0)


def block_layout(sizes: dict[str, int]) -> BlockLayout | None:
    """The model's layers, from ``read_headers``: of its numbered blocks, transformer blocks
    (with attention weights) before others (a codec's convolutions), then the heaviest (the
    rule workers/transformers/layers.find_blocks finds them by); None without two."""
    groups: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    attends: set[str] = set()
    for key, size in sizes.items():
        name = key.partition(":")[2]
        match = _BLOCK.match(name)
        if match:
            groups[match["prefix"]][int(match["index"])] += size
            if _ATTENTION.search(name[match.end():]):
                attends.add(match["prefix"])
    ranked = sorted(((prefix in attends, sum(g.values()), prefix)
                     for prefix, g in groups.items() if len(g) >= 2), reverse=True)
    if not ranked:
        return None
    prefix = ranked[0][2]
    blocks = groups[prefix]
    total = sum(sizes.values())
    return BlockLayout(prefix, tuple(blocks[i] for i in sorted(blocks)),
                       total - sum(blocks.values()))


def model_layers(path: Path | None) -> BlockLayout | None:
    """``block_layout`` of a folder (or file) of safetensors (cached per path and mtime: the
    status reads it for every partly offloaded slot); None when it has none."""
    if path is None:
        return None
    try:
        return _layout(str(path), path.stat().st_mtime)
    except OSError:
        return None


@lru_cache(maxsize=64)
def _layout(path: str, _mtime: float) -> BlockLayout | None:
    return block_layout(read_headers(Path(path)))


OVERHEAD = 1.2  # activations and the allocator's slack on top of weights (estimate.from_file)


def layer_costs_mb(layout: BlockLayout, prefetch: bool) -> tuple[float, float]:
    """(MB per layer kept on the GPU, MB on the GPU whatever the count): the other weights,
    and the staging room of the streamed layers, one block in use plus, with prefetch, the
    next one arriving; both with ``OVERHEAD``."""
    per_layer = sum(layout.block_bytes) / max(1, layout.count) * OVERHEAD / 2**20
    staging = layout.largest_block * (2 if prefetch else 1)
    fixed = (layout.other_bytes * OVERHEAD + staging) / 2**20
    return per_layer, fixed
