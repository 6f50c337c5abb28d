"""How much of a model's trained context the GPUs can hold: the KV cache for the whole
context must fit beside the weights in the VRAM a model can have; when it does not, the
context is lowered to the largest power of two that fits, never below :data:`CTX_FLOOR`.

:func:`choose_context` decides over plain figures (table-tested); :class:`ContextFitter` reads
them from a GGUF and is what the catalog is built with (``catalog/context.py``). The room is
taken once, at startup (:func:`model_room_mb`), so a reload does not shrink contexts because
the models it serves hold VRAM by then.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

from ..catalog.manifest import KV_CACHE_BYTES, ModelManifest
from .gguf_info import read_gguf_info
from .inventory import GPUInfo, NvmlProbe

CTX_FLOOR = 2048  # a context lowered to fit stops here: less serves no coding agent
MB = 2**20


@dataclass(frozen=True, slots=True)
class ContextChoice:
    """The context to serve, and why it is less than the trained one (None: it is not)."""

    ctx: int
    note: str | None = None


def choose_context(trained: int, weights_mb: float, kv_mb_per_token: float, room_mb: float,
                   *, fixed_mb: float = 0.0, floor: int = CTX_FLOOR) -> ContextChoice:
    """``trained`` when weights + ``fixed_mb`` (compute buffers) + its KV cache fit in
    ``room_mb``; else the largest power of two below it that fits, not below ``floor`` (nor
    above ``trained``). A model whose floor does not fit either gets the floor: the planner
    offloads layers to the CPU or refuses it, as for any model too big."""
    def need(ctx: int) -> float:
        return weights_mb + fixed_mb + kv_mb_per_token * ctx

    lowest = min(trained, floor)
    if need(trained) <= room_mb or trained <= lowest:
        return ContextChoice(trained)
    ctx = 2 ** math.floor(math.log2(trained))
    if ctx == trained:
        ctx //= 2
    while ctx > lowest and need(ctx) > room_mb:
        ctx //= 2
    ctx = max(ctx, lowest)
    free = max(0.0, room_mb - weights_mb - fixed_mb)
    note = (f"lowered from {trained} to {ctx}: the KV cache for {trained} tokens needs "
            f"{kv_mb_per_token * trained:.0f} MB, the GPUs have {free:.0f} MB free beside "
            f"the weights ({weights_mb + fixed_mb:.0f} MB with compute buffers)")
    if need(ctx) > room_mb:
        note += f"; {ctx} is the floor, and does not fit either"
    return ContextChoice(ctx, note)


def model_room_mb(gpus: list[GPUInfo], margin_mb: int, nvml: NvmlProbe | None = None) -> int:
    """The VRAM one model can have: every GPU's free memory (its capacity; with NVML, what
    the driver says is free, now) less the margin kept on each. Splitting a model across GPUs
    is how it gets more than one GPU's."""
    room = 0
    for gpu in gpus:
        free = gpu.vram_mb
        if nvml is not None and gpu.source == "nvml":
            with contextlib.suppress(Exception):  # an NVML hiccup: its capacity stands
                free = min(free, nvml.free_mb(gpu.index))
        room += max(0, free - margin_mb)
    return room


def context_fitter(gpus: list[GPUInfo], margin_mb: int,
                   nvml: NvmlProbe | None = None) -> ContextFitter:
    """The fitter a coordinator builds its catalogs with: the room taken now, once."""
    return ContextFitter(model_room_mb(gpus, margin_mb, nvml))


class ContextFitter:
    """A :data:`~..catalog.context.ContextFit`: a model's trained context lowered as far as
    ``room_mb`` needs, from its GGUF's weights and KV cache size per token."""

    def __init__(self, room_mb: int, floor: int = CTX_FLOOR) -> None:
        self.room_mb = room_mb
        self.floor = floor

    def __call__(self, manifest: ModelManifest, path: Path) -> ModelManifest:
        info = read_gguf_info(path)
        if info is None or info.block_count == 0:
            return manifest
        per_token = info.kv_bytes(1, k_bytes=KV_CACHE_BYTES[manifest.cache_type_k],
                                  v_bytes=KV_CACHE_BYTES[manifest.cache_type_v]) / MB
        choice = choose_context(manifest.ctx_size, info.total_bytes / MB, per_token,
                                self.room_mb, fixed_mb=info.compute_bytes() / MB,
                                floor=self.floor)
        if choice.ctx == manifest.ctx_size:
            return manifest
        fitted = manifest.model_copy(update={"ctx_size": choice.ctx})
        fitted.ctx_note = choice.note
        return fitted
