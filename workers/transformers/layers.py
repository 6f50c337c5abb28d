"""Layer offload: a model's repeated blocks (its decoder or encoder layers) split, the first
``gpu_layers`` kept on the device with the rest of the model, the others kept in CPU RAM and
moved to the device for their own forward pass by diffusers' group offloading hooks (block
level, one block a group), a maintained mechanism that works on any torch module.

With prefetch on a CUDA device the hooks copy through a side stream from pinned CPU memory,
each streamed block starting the next one's copy before its own compute (the chain diffusers'
lazy prefetch would trace on a first forward, set here from the blocks' known order). On the
CPU the same hooks are installed with the CPU as the device, so the split and the wiring run
(and are tested) everywhere; streams and pinned memory are CUDA's, tested on a GPU only.

The pinned copies and the stream belong to the hooks, which belong to the model: they go when
the worker's model does (the process ends with it). The CPU-RAM tier moves only what is
resident (:func:`place_resident`); the streamed blocks stay in CPU RAM and their hooks stay,
so a model parked and brought back keeps its plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# a block's arguments its hook does not copy to the device: the KV cache, updated in place
# (a copy would drop what the block adds to it)
KEEP_KWARGS = ("past_key_values", "past_key_value")


def resident_layers(total: int, gpu_layers: int | None) -> int:
    """How many of ``total`` blocks stay on the device: all for None or -1 (or more than
    there are), else ``gpu_layers``."""
    if gpu_layers is None or gpu_layers < 0:
        return total
    return min(gpu_layers, total)


def find_blocks(module: Any) -> tuple[str, Any] | None:
    """The model's repeated blocks: of its ``ModuleList``s of two or more blocks of one class,
    transformer blocks (holding an attention module) before others (a codec's convolutions),
    then the one whose parameters weigh the most (a decoder's layers, not an encoder's few);
    its dotted name and the list. None when the model has none (the same rule as
    model_boss/gpu/safetensors_info.block_layout, over tensor names)."""
    import torch

    best: tuple[tuple[bool, int], str, Any] | None = None
    for name, child in module.named_modules():
        if not isinstance(child, torch.nn.ModuleList) or len(child) < 2:
            continue
        if len({type(block) for block in child}) != 1:
            continue
        attends = any("attention" in type(m).__name__.lower() for m in child[0].modules())
        rank = (attends, sum(p.numel() * p.element_size() for p in child.parameters()))
        if best is None or rank > best[0]:
            best = (rank, name, child)
    return (best[1], best[2]) if best else None


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """Which blocks stream: ``blocks`` (the list, at ``name``), the first ``resident`` kept on
    the device, the rest streamed; ``prefetch``: through a side stream, each block's copy
    overlapping the one before's compute."""

    name: str
    blocks: Any
    resident: int
    device: str
    prefetch: bool

    @property
    def total(self) -> int:
        return len(self.blocks)

    @property
    def streamed(self) -> list[Any]:
        return list(self.blocks)[self.resident:]

    def to_dict(self) -> dict[str, Any]:
        """What ``/health`` reports of it."""
        return {"gpu_layers": self.resident, "total_layers": self.total,
                "layers_module": self.name, "offload_prefetch": self.prefetch}


def place_resident(module: Any, device: str, plan: LayerPlan) -> None:
    """Every weight but the streamed blocks' onto ``device`` (a load, the CPU-RAM tier's
    park and return); the streamed blocks stay where their hooks keep them."""
    streamed = {id(m) for block in plan.streamed for m in block.modules()}
    for sub in module.modules():
        if id(sub) not in streamed:
            sub._apply(lambda t: t.to(device), recurse=False)


def offload_layers(module: Any, device: str, gpu_layers: int | None,
                   prefetch: bool) -> LayerPlan | None:
    """Split ``module`` (loaded on the CPU) by ``gpu_layers``: the resident part onto
    ``device``, group offloading hooks on the streamed blocks. None when the model has no
    repeated blocks or every one of them fits (nothing to stream: the model moves whole)."""
    import torch
    from diffusers.hooks import apply_group_offloading

    found = find_blocks(module)
    if found is None:
        return None
    name, blocks = found
    resident = resident_layers(len(blocks), gpu_layers)
    if resident >= len(blocks):
        return None
    streams = prefetch and torch.device(device).type == "cuda"
    plan = LayerPlan(name, blocks, resident, device, streams)
    place_resident(module, device, plan)
    # the hooks go on the streamed blocks alone: a holder whose only child is their list
    holder = torch.nn.Module()
    holder.blocks = torch.nn.ModuleList(plan.streamed)
    apply_group_offloading(holder, onload_device=torch.device(device),
                           offload_device=torch.device("cpu"), offload_type="block_level",
                           num_blocks_per_group=1, use_stream=streams,
                           exclude_kwargs=list(KEEP_KWARGS))
    if streams:
        _chain_prefetch(plan.streamed)
    return plan


def _chain_prefetch(streamed: list[Any]) -> None:
    """Each streamed block's hook starts the next one's copy (diffusers' ``next_group``), the
    chain its lazy prefetch hook would trace. The first block loads itself with a blocking
    copy (nothing before it waits on the stream for it); the others' copies are waited for
    by the hook that uses them."""
    hooks = [block._diffusers_hook.get_hook("group_offloading") for block in streamed]
    for hook, following in zip(hooks, hooks[1:], strict=False):
        hook.next_group = following.group
        following.group.onload_self = False
        following.group.non_blocking = True


def streamed_blocks(plan: LayerPlan | None) -> list[int]:
    """The indices of the blocks that carry offload hooks (what the tests check)."""
    if plan is None:
        return []
    return [i for i, block in enumerate(plan.blocks)
            if getattr(block, "_diffusers_hook", None) is not None
            and block._diffusers_hook.get_hook("group_offloading") is not None]
