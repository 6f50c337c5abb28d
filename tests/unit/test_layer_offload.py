"""Layer offload for transformers models, without a model: the blocks read from safetensors
headers (gpu/safetensors_info.py), the layers ``auto`` keeps on the GPU for the VRAM the
planner gives (placement.place_partial over those costs), the flags the backend gives its
worker, the split the worker makes of ``--gpu-layers`` (workers/transformers/layers.py) and
``ps``'s "N of M layers"."""

from __future__ import annotations

import json
import struct

import pytest

from model_boss.backends.transformers import TransformersBackend
from model_boss.catalog.catalog import CatalogEntry
from model_boss.catalog.manifest import ModelManifest
from model_boss.gpu.placement import LayerCosts, Placement, layers_on_gpu, place, place_partial
from model_boss.gpu.processor import processor_split
from model_boss.gpu.safetensors_info import (
    BlockLayout,
    block_layout,
    layer_costs_mb,
    model_layers,
    read_headers,
)
from model_boss.settings import Settings
from workers.transformers.layers import resident_layers
from workers.transformers.options import parse_args

MB = 2**20


def sizes(**groups: tuple[int, int]) -> dict[str, int]:
    """``prefix=(count, bytes each)`` as read_headers' names; ``other`` unnumbered."""
    out = {}
    for prefix, (count, each) in groups.items():
        if prefix == "other":
            out["m.safetensors:model.embed_tokens.weight"] = count * each
            continue
        for i in range(count):
            out[f"m.safetensors:{prefix.replace('_', '.')}.{i}.mlp.weight"] = each
    return out


@pytest.mark.parametrize("table, prefix, count, other", [
    (sizes(model_layers=(28, 100), other=(1, 500)), "model.layers", 28, 500),
    # a codec's many light stages lose to the decoder's heavier layers
    (sizes(model_layers=(4, 1000), codec_stages=(12, 10)), "model.layers", 4, 120),
    (sizes(encoder_layer=(2, 50)), "encoder.layer", 2, 0),
    (sizes(model_layers=(1, 1000), other=(1, 5)), None, 0, 0),  # one block: nothing to split
    # blocks with attention are the layers, however much a codec's convolutions weigh
    ({**sizes(codec_stages=(4, 1000)),
      **{f"m.safetensors:lm.layers.{i}.self_attn.q_proj.weight": 10 for i in range(3)}},
     "lm.layers", 3, 4000),
    ({}, None, 0, 0),
])
def test_the_heaviest_numbered_blocks_are_the_layers(table, prefix, count, other):
    layout = block_layout(table)
    if prefix is None:
        assert layout is None
    else:
        assert (layout.prefix, layout.count, layout.other_bytes) == (prefix, count, other)


def write_safetensors(path, tensors: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file of float32 zeros (the header is all a reader of sizes reads)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        length = 4
        for n in shape:
            length *= n
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + length]}
        offset += length
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_headers_of_a_sharded_folder(tmp_path):
    write_safetensors(tmp_path / "model-00001.safetensors",
                      {"model.embed_tokens.weight": (100, 8),
                       "model.layers.0.mlp.weight": (8, 8)})
    write_safetensors(tmp_path / "model-00002.safetensors",
                      {"model.layers.1.mlp.weight": (8, 8), "lm_head.weight": (100, 8)})
    (tmp_path / "broken.safetensors").write_bytes(b"\x01")
    assert sum(read_headers(tmp_path).values()) == 4 * (800 + 64 + 64 + 800)
    layout = model_layers(tmp_path)
    assert (layout.prefix, layout.block_bytes, layout.other_bytes) == \
        ("model.layers", (256, 256), 6400)
    assert model_layers(tmp_path / "missing") is None and model_layers(None) is None


LAYOUT = BlockLayout("model.layers", (200 * MB,) * 28, 1000 * MB)  # a 7B-like, in MB


@pytest.mark.parametrize("prefetch, per_layer, fixed", [
    (True, 240.0, 1600.0),   # others 1000 x 1.2 + two blocks staged (one in use, one coming)
    (False, 240.0, 1400.0),  # one block staged
])
def test_layer_costs_cover_resident_layers_and_staging(prefetch, per_layer, fixed):
    assert layer_costs_mb(LAYOUT, prefetch) == pytest.approx((per_layer, fixed))


@pytest.mark.parametrize("free_mb, minimum, layers", [
    (20000, 0, None),  # the whole model fits (place_single): no offload
    (8000, 0, 26),     # (8000 - 1600) // 240
    (6400, 0, 20),
    (1600 + 239, 0, None),  # not one layer's room
    (4000, 12, None),  # 10 layers fit, fewer than min_gpu_layers
    (4500, 12, 12),
])
def test_auto_keeps_as_many_layers_as_the_planners_vram_holds(free_mb, minimum, layers):
    per_layer, fixed = layer_costs_mb(LAYOUT, prefetch=True)
    costs = LayerCosts(per_layer, fixed, LAYOUT.count, minimum)
    whole = int(fixed + 28 * per_layer)
    placement = place(whole, {0: free_mb}, allow_split=False, partial=costs)
    if layers is None:
        assert placement is None or placement.gpu_layers is None
    else:
        assert placement == place_partial({0: free_mb}, costs)
        assert (placement.gpu_layers, placement.total_layers) == (layers, 28)
        assert placement.allocations[0] <= free_mb


@pytest.mark.parametrize("placement, wanted, layers", [
    (None, "auto", 0),
    (Placement({}, "single"), 5, 0),
    (Placement({0: 100}, "single"), "auto", -1),
    (Placement({0: 100}, "single"), 5, 5),
    (Placement({0: 100}, "partial", gpu_layers=3, total_layers=8), "auto", 3),
])
def test_layers_on_gpu(placement, wanted, layers):
    assert layers_on_gpu(placement, wanted) == layers


def backend(tmp_path, **fields) -> TransformersBackend:
    manifest = ModelManifest(id="voice", category="tts", backend="transformers",
                             path=str(tmp_path), **fields)
    settings = Settings(manifests=[], tasks_file=None, state_dir=tmp_path / "state")
    return TransformersBackend(CatalogEntry(manifest, tmp_path), settings)


@pytest.mark.parametrize("fields, placement, flags", [
    ({}, Placement({0: 100}, "single"), []),
    ({"gpu_layers": 5, "allow_partial": True}, Placement({0: 100}, "single"),
     ["--gpu-layers", "5"]),
    ({"allow_partial": True}, Placement({0: 100}, "partial", gpu_layers=3, total_layers=8),
     ["--gpu-layers", "3"]),
    ({"allow_partial": True, "offload_prefetch": False},
     Placement({0: 100}, "partial", gpu_layers=3, total_layers=8),
     ["--gpu-layers", "3", "--no-offload-prefetch"]),
    ({"gpu_layers": 5}, None, []),  # no GPU: the worker runs on the CPU, nothing to split
])
def test_the_worker_is_told_its_split(tmp_path, fields, placement, flags):
    argv = backend(tmp_path, **fields).model_flags(placement)
    tail = argv[argv.index("--max-batch-wait-ms") + 2:]
    assert tail == flags
    options = parse_args([*argv, "--port", "1"])
    assert options.gpu_layers == (int(flags[1]) if flags else None)
    assert options.offload_prefetch == ("--no-offload-prefetch" not in flags)


@pytest.mark.parametrize("total, wanted, resident", [
    (28, None, 28), (28, -1, 28), (28, 20, 20), (28, 0, 0), (28, 40, 28), (2, 1, 1),
])
def test_the_worker_keeps_gpu_layers_resident(total, wanted, resident):
    assert resident_layers(total, wanted) == resident


def test_ps_counts_the_layers_on_the_gpu():
    split = processor_split(tier="gpu", size_mb=1000, leased_mb=300, gpu_layers=1,
                            total_layers=4, declared=True)
    assert split.label == "75%/25% CPU/GPU (declared)"
    assert (split.to_dict()["gpu_layers"], split.to_dict()["total_layers"]) == (1, 4)
    whole = processor_split(tier="gpu", size_mb=1000, leased_mb=1000, gpu_layers=-1,
                            total_layers=4, declared=False)
    assert (whole.gpu_layers, whole.total_layers) == (None, None)
