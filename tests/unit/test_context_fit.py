"""How much of a trained context the GPUs hold (gpu/context_fit.py): the pure choice over
figures, the fitter over a real GGUF header, the room one model can have."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.catalog.manifest import ModelManifest
from model_boss.gpu.context_fit import (
    CTX_FLOOR,
    ContextChoice,
    ContextFitter,
    choose_context,
    model_room_mb,
)
from model_boss.gpu.inventory import GPUInfo

# Llama 3.1 8B at Q4_K_M: 4.6 GB of weights, 131072 trained, f16 KV 0.125 MB per token
LLAMA_8B = {"trained": 131072, "weights_mb": 4600, "kv_mb_per_token": 0.125}
# SmolLM2-135M at Q4_1: 94 MB, 8192 trained, f16 KV 0.0225 MB per token
SMOL = {"trained": 8192, "weights_mb": 94, "kv_mb_per_token": 0.0225}


@pytest.mark.parametrize(("model", "room_mb", "fixed_mb", "ctx"), [
    (SMOL, 7680, 162, 8192),               # the demo on an 8 GB GPU: all of it
    (LLAMA_8B, 23552, 300, 131072),        # a 24 GB GPU holds the whole 128k
    (LLAMA_8B, 11776, 300, 32768),         # 12 GB: 64k needs 12.9 GB, 32k fits
    (LLAMA_8B, 7680, 300, 16384),          # 8 GB: 16k (2 GB of KV) fits beside 4.9 GB
    (LLAMA_8B, 5200, 300, 2048),           # hardly room for the weights: the floor
    (LLAMA_8B, 4000, 0, 2048),             # not even the weights: the floor all the same
    ({**LLAMA_8B, "trained": 40960}, 9000, 0, 32768),  # not a power of two: 32k below it
    ({**LLAMA_8B, "trained": 1024}, 100, 0, 1024),     # trained below the floor: as trained
    ({**SMOL, "trained": 8192}, 94 + 0.0225 * 8192, 0, 8192),  # exactly full: fits
])
def test_choose_context(model, room_mb, fixed_mb, ctx) -> None:
    choice = choose_context(**model, room_mb=room_mb, fixed_mb=fixed_mb)
    assert choice.ctx == ctx
    assert (choice.note is None) == (ctx == model["trained"])
    assert ctx >= min(CTX_FLOOR, model["trained"])


def test_the_note_says_what_the_full_context_needs_and_what_is_free() -> None:
    assert choose_context(**LLAMA_8B, room_mb=11776, fixed_mb=300) == ContextChoice(
        32768, "lowered from 131072 to 32768: the KV cache for 131072 tokens needs 16384 MB, "
               "the GPUs have 6876 MB free beside the weights (4900 MB with compute buffers)")
    floor = choose_context(**LLAMA_8B, room_mb=4000)
    assert floor.note.endswith("; 2048 is the floor, and does not fit either")
    assert choose_context(**LLAMA_8B, room_mb=4000, floor=8192).ctx == 8192


def write_model(path: Path, context: int) -> Path:
    """A GGUF whose header says what the KV cache needs: 2 blocks, 2 KV heads of 16."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_token_list([f"t{i}" for i in range(50)])
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("room_mb", "cache_type", "ctx", "lowered"), [
    (1000, "f16", 1_048_576, False),   # 1M tokens x 256 B = 256 MB of KV: fits
    (150, "f16", 262_144, True),       # 85 MB beside 65 MB of weights and compute: 256k
    (150, "q8_0", 524_288, True),      # a quantised cache holds twice the context
])
def test_the_fitter_reads_the_kv_size_from_the_file(tmp_path, room_mb, cache_type, ctx,
                                                    lowered) -> None:
    path = write_model(tmp_path / "m.gguf", 1_048_576)
    manifest = ModelManifest(id="m", path=str(path), ctx_size=1_048_576,
                             cache_type_k=cache_type, cache_type_v=cache_type)
    manifest.ctx_from = "trained"
    fitted = ContextFitter(room_mb)(manifest, path)
    assert fitted.ctx_size == ctx
    assert (fitted.ctx_note or "").startswith("lowered from 1048576") == lowered
    assert fitted.ctx_from == "trained" and manifest.ctx_size == 1_048_576  # a copy


def test_a_file_without_blocks_is_left_alone(tmp_path) -> None:
    from tests.gguf_fixtures import write_gguf

    path = write_gguf(tmp_path / "m.gguf", blocks=0)
    manifest = ModelManifest(id="m", path=str(path), ctx_size=8192)
    assert ContextFitter(1)(manifest, path) is manifest


class Nvml:
    def __init__(self, free: dict[int, int]) -> None:
        self.free = free

    def free_mb(self, index: int) -> int:
        if index not in self.free:
            raise RuntimeError("NVML hiccup")
        return self.free[index]


@pytest.mark.parametrize(("gpus", "nvml", "room"), [
    ([GPUInfo(0, "sim", 8192, "declared")], None, 7680),
    ([GPUInfo(0, "a", 8192, "declared"), GPUInfo(1, "b", 4096, "declared")], None, 11264),
    ([GPUInfo(0, "rtx", 24576, "nvml")], Nvml({0: 20000}), 19488),  # a desktop holds some
    ([GPUInfo(0, "rtx", 24576, "nvml")], Nvml({}), 24064),  # NVML failed: its capacity
    ([GPUInfo(0, "tiny", 256, "declared")], None, 0),
])
def test_the_room_one_model_can_have(gpus, nvml, room) -> None:
    assert model_room_mb(gpus, 512, nvml) == room
