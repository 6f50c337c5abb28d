"""Layer offload on a GPU (workers/transformers/layers.py): VRAM held and per-token latency of a
VibeVoice-sized Qwen2 decoder (28 layers, width 3584: Qwen2.5-7B, VibeVoice's language model)
with 28, 20, 12 and 8 of its layers on the GPU, the rest streamed from pinned CPU memory with
prefetch (and 20 without), side by side with no offload, in one run.

Random bf16 weights built in CPU RAM (about 15 GB; nothing is downloaded). Each row: the plan
applied, a 64-token prompt, then ``--tokens`` single-token decode steps timed (median), and
``torch.cuda.max_memory_allocated`` over the row. Goals: VRAM within 10 % of the lease the
planner would take for that count (gpu/estimate.resident: the other weights and resident
layers with 20 % for activations, and one staged layer, two with prefetch; the ``VRAM/lease``
column), and with prefetch at 20 layers at most 2x no offload's per-token time.

Needs CUDA: without it, it says so and measures nothing.

    .venv/bin/python benchmarks/layer_offload.py [--tokens 32] [--layers 28] [--hidden 3584]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_boss.gpu.estimate import VramEstimate, resident
from model_boss.gpu.safetensors_info import BlockLayout
from workers.transformers.layers import offload_layers

MB = 2**20


def build(layers: int, hidden: int, device: str = "cpu"):
    """The decoder, its weights in CPU RAM (or on the meta device: shapes alone)."""
    import torch
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(hidden_size=hidden, intermediate_size=hidden * 37 // 7,
                         num_hidden_layers=layers, num_attention_heads=hidden // 128,
                         num_key_value_heads=4, vocab_size=152064,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the RAM of float32
    try:
        with torch.device(device):
            return Qwen2Model(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)


def leases(model) -> tuple[BlockLayout, VramEstimate]:
    """The model's blocks as the safetensors headers would say them, and its whole estimate
    (weights x 1.2, estimate.from_file's rule)."""
    blocks = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in model.layers]
    other = sum(p.numel() * p.element_size() for p in model.parameters()) - sum(blocks)
    return (BlockLayout("layers", tuple(blocks), other),
            VramEstimate(int((sum(blocks) + other) * 1.2 / MB) + 1, "file"))


def undo(model, plan) -> None:
    """The hooks off the streamed blocks, every weight back in CPU RAM."""
    if plan is not None:
        for block in plan.streamed:
            block._diffusers_hook.remove_hook("group_offloading", recurse=False)
    model.to("cpu")


def row(model, gpu_layers: int | None, prefetch: bool, tokens: int) -> dict:
    import torch
    from transformers import DynamicCache

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    plan = None
    if gpu_layers is None:
        model.to("cuda")
    else:
        plan = offload_layers(model, "cuda", gpu_layers, prefetch)
        if plan is None:  # every layer fits: nothing streams
            model.to("cuda")
    steps = []
    with torch.inference_mode():
        cache = DynamicCache()
        ids = torch.randint(0, 1000, (1, 64), device="cuda")
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        for _ in range(tokens):
            torch.cuda.synchronize()
            started = time.perf_counter()
            out = model(input_ids=ids[:, :1], past_key_values=out.past_key_values,
                        use_cache=True)
            torch.cuda.synchronize()
            steps.append(time.perf_counter() - started)
    held = torch.cuda.max_memory_allocated() // MB
    undo(model, plan)
    return {"s_per_token": statistics.median(steps), "vram_mb": held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=3584)
    args = parser.parse_args()
    import torch

    rows = [("none", None, True)] + [(f"{n}", n, True) for n in (28, 20, 12, 8)
                                     if n < args.layers] + [("20 no prefetch", 20, False)]
    if not torch.cuda.is_available():
        layout, whole = leases(build(args.layers, args.hidden, "meta"))
        print("layer_offload: no CUDA GPU here; nothing measured (run it on a machine with "
              "one: the CPU tests cover the wiring, not VRAM or latency). The leases the "
              "planner would take:")
        print(f"{'gpu layers':<16}{'lease MB':>10}")
        for name, layers, prefetch in rows:
            lease = whole.mb if layers is None else resident(whole, layout, layers, prefetch).mb
            print(f"{name:<16}{lease:>10}")
        return
    model = build(args.layers, args.hidden)
    layout, whole = leases(model)
    base = None
    print(f"{'gpu layers':<16}{'s/token':>10}{'x none':>8}{'VRAM MB':>10}{'lease MB':>10}"
          f"{'VRAM/lease':>12}")
    for name, layers, prefetch in rows:
        result = row(model, layers, prefetch, args.tokens)
        base = base or result["s_per_token"]
        lease = whole.mb if layers is None else resident(whole, layout, layers, prefetch).mb
        print(f"{name:<16}{result['s_per_token']:>10.4f}{result['s_per_token'] / base:>8.2f}"
              f"{result['vram_mb']:>10}{lease:>10}{result['vram_mb'] / lease:>12.2f}")


if __name__ == "__main__":
    main()
