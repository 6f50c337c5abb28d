"""Memory for the diffusers worker: where the weights live (offload strategies, through
diffusers' own APIs), the VAE decode decision (a pure function over numbers) and carrying it
out on a real VAE, and the probes that report RAM / VRAM use.

torch is imported inside the functions that need it so the pure decision stays cheap to import.
"""

from __future__ import annotations

import gc
import os
from contextlib import ExitStack, contextmanager
from enum import StrEnum
from typing import Any, NamedTuple

import psutil

PIXELS_512 = 512 * 512
MB = 2**20


class VaeMode(StrEnum):
    """Where and how one request's latents are decoded."""

    GPU = "gpu"  # plain decode on the accelerator
    TILED = "tiled"  # VAE tiling on the accelerator: memory of about one 512×512 tile
    CPU = "cpu"  # the VAE moves to the CPU for this decode and back afterwards
    CPU_DEVICE = "cpu-device"  # no CUDA at all: everything runs on the CPU already


class VaeDecision(NamedTuple):
    """The decision for one request; unpacks as ``(mode, estimated_mb, reason)``."""

    mode: VaeMode
    estimated_mb: int
    reason: str

    def report(self, free_mb: int | None) -> dict[str, Any]:
        """The ``memory_decisions`` object of a ``/generate`` answer."""
        return {"vae": str(self.mode), "estimated_decode_mb": self.estimated_mb,
                "free_mb": free_mb, "reason": self.reason}


def decode_estimate_mb(width: int, height: int, mb_per_512px: float) -> int:
    """Decode memory grows linearly with the pixel count: coefficient × pixels / 512²."""
    return int(round(mb_per_512px * width * height / PIXELS_512))


def decide_vae(width: int, height: int, coeff_mb_per_512px: float, free_mb: int | None,
               margin_mb: int, allow_cpu: bool) -> VaeDecision:
    """Decode on the GPU when the estimate fits in ``free_mb − margin_mb``; else tiled (tiles
    cost about one 512×512 decode); else on the CPU when allowed, or tiled as a last try.
    ``free_mb=None`` means there is no CUDA device: everything is on the CPU already."""
    need = decode_estimate_mb(width, height, coeff_mb_per_512px)
    if free_mb is None:
        return VaeDecision(VaeMode.CPU_DEVICE, need,
                           "no CUDA device: the whole pipeline runs on the CPU")
    room = free_mb - margin_mb
    if need <= room:
        return VaeDecision(VaeMode.GPU, need, f"{need} MB fits in {room} MB free after margin")
    tile = min(need, int(round(coeff_mb_per_512px)))
    if tile <= room:
        return VaeDecision(VaeMode.TILED, need,
                           f"{need} MB does not fit in {room} MB; 512px tiles need ~{tile} MB")
    if allow_cpu:
        return VaeDecision(VaeMode.CPU, need,
                           f"even 512px tiles (~{tile} MB) do not fit in {room} MB; "
                           "decoding on the CPU")
    return VaeDecision(VaeMode.TILED, need,
                       f"512px tiles (~{tile} MB) may not fit in {room} MB and CPU decode "
                       "is off; trying tiled")


def oom_fallback(mode: VaeMode, allow_cpu: bool, can_move_vae: bool) -> VaeMode | None:
    """The one retry after CUDA runs out of memory mid-decode: plain → tiled; tiled → CPU
    when allowed and nothing else owns the VAE's placement; otherwise none (re-raise)."""
    if mode is VaeMode.GPU:
        return VaeMode.TILED
    if mode is VaeMode.TILED and allow_cpu and can_move_vae:
        return VaeMode.CPU
    return None


# -- carrying the decision out ------------------------------------------------------------


@contextmanager
def _vae_placed(vae: Any, device: Any | None, dtype: Any):
    """Move (``device=None``: only recast) the VAE for one decode, then put it back as it was."""
    first = next(vae.parameters())
    home_device, home_dtype = first.device, first.dtype
    recast = dtype != home_dtype  # only cast when needed: diffusers warns on every cast
    vae.to(device=device, dtype=dtype if recast else None)
    try:
        yield
    finally:
        vae.to(device=home_device if device is not None else None,
               dtype=home_dtype if recast else None)


@contextmanager
def _tiling(vae: Any):
    vae.enable_tiling()
    try:
        yield
    finally:
        vae.disable_tiling()


def _scaled_for_decode(pipe: Any, latents: Any, width: int, height: int) -> Any:
    """Undo what the pipeline does to latents before its own decode (SD, SDXL, SD3, FLUX)."""
    import torch

    vae = pipe.vae
    if hasattr(pipe, "_unpack_latents"):  # FLUX packs its latents into 2×2 patches
        latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor)
    config = vae.config
    mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
    if mean is not None and std is not None and latents.ndim == 4:  # SDXL-style statistics
        shape = (1, len(mean), 1, 1)
        mean_t = torch.tensor(mean).view(shape).to(latents.device, latents.dtype)
        std_t = torch.tensor(std).view(shape).to(latents.device, latents.dtype)
        return latents * std_t / config.scaling_factor + mean_t
    latents = latents / config.scaling_factor
    shift = getattr(config, "shift_factor", None)
    return latents + shift if shift else latents


def decode_latents(pipe: Any, latents: Any, width: int, height: int, mode: VaeMode,
                   exec_device: Any, hooks: str | None) -> list[Any]:
    """Decode ``latents`` with ``pipe.vae`` as ``mode`` says; PIL images.

    ``exec_device`` is where the VAE computes. ``hooks`` names the diffusers offload that owns
    the weights' placement ("model", "sequential", "group"; None when nothing does): the VAE
    is then never moved by hand, and only model offload lets it be recast to float32.
    """
    import torch

    vae = pipe.vae
    scaled = _scaled_for_decode(pipe, latents, width, height)
    # SDXL-family pipelines upcast an fp16 VAE that would overflow; do as they do
    upcast = (hooks in (None, "model") and hasattr(pipe, "upcast_vae")
              and vae.dtype == torch.float16 and getattr(vae.config, "force_upcast", False))
    with torch.no_grad(), ExitStack() as stack:
        if mode is VaeMode.CPU:
            if hooks is not None:
                raise ValueError(f"the VAE cannot move to the CPU under {hooks} offload")
            # fp16 kernels are slow or missing on the CPU: decode there in float32
            exec_device, dtype = torch.device("cpu"), torch.float32
            stack.enter_context(_vae_placed(vae, exec_device, dtype))
        else:
            dtype = torch.float32 if upcast else vae.dtype
            if hooks is None or upcast:
                stack.enter_context(_vae_placed(vae, exec_device if hooks is None else None,
                                                dtype))
            if mode is VaeMode.TILED:
                stack.enter_context(_tiling(vae))
        decoded = vae.decode(scaled.to(exec_device, dtype), return_dict=False)[0]
    return pipe.image_processor.postprocess(decoded.float(), output_type="pil")


# -- where the weights live -----------------------------------------------------------------


class Offload(StrEnum):
    """How the weights are spread between VRAM and RAM, all through diffusers' own APIs."""

    NONE = "none"  # pipe.to(device)
    MODEL = "model"  # enable_model_cpu_offload: one whole component on the GPU at a time
    SEQUENTIAL = "sequential"  # enable_sequential_cpu_offload: one layer at a time
    GROUP = "group"  # enable_group_offload per component, with CUDA streams
    BALANCED = "balanced"  # from_pretrained(device_map="balanced", max_memory=...)


def torch_dtype(name: str, device: str) -> Any:
    """``auto``: float32 on the CPU; bfloat16 on GPUs that have it (FLUX / SD3 overflow in
    float16), else float16."""
    import torch

    if name != "auto":
        return getattr(torch, name)
    if device != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def place_weights(pipe: Any, device: str, offload: Offload, notes: list[str]) -> Offload | None:
    """Put a freshly loaded pipeline where ``offload`` says; returns the offload whose hooks
    now own the weights' placement (model / sequential / group), or None."""
    import torch

    if device != "cuda" or offload is Offload.NONE:
        pipe.to(device)
        return None
    if offload is Offload.BALANCED:
        return None  # from_pretrained(device_map=...) placed every component already
    if offload is Offload.MODEL:
        pipe.enable_model_cpu_offload()
    elif offload is Offload.SEQUENTIAL:
        pipe.enable_sequential_cpu_offload()
    else:
        from diffusers.hooks import apply_group_offloading

        cuda, cpu = torch.device("cuda"), torch.device("cpu")
        for name, component in pipe.components.items():
            if not isinstance(component, torch.nn.Module):
                continue
            if hasattr(component, "enable_group_offload"):  # diffusers models
                component.enable_group_offload(
                    onload_device=cuda, offload_device=cpu, offload_type="block_level",
                    num_blocks_per_group=1, use_stream=True)
            else:  # transformers text encoders: no block structure to rely on
                apply_group_offloading(component, onload_device=cuda, offload_device=cpu,
                                       offload_type="leaf_level", use_stream=True)
                notes.append(f"{name}: leaf-level group offload")
    return offload


# -- probes -------------------------------------------------------------------------------


def rss_mb() -> int:
    """Resident memory of this process."""
    return int(psutil.Process(os.getpid()).memory_info().rss // MB)


def cuda_report() -> dict[str, int]:
    """Allocated / reserved / peak VRAM of this process, summed over its visible GPUs, and
    the driver's free VRAM on the GPUs it uses."""
    import torch

    devices = range(torch.cuda.device_count())
    # mem_get_info opens a CUDA context (hundreds of MB) on a GPU this process never used
    used = [d for d in devices if torch.cuda.memory_reserved(d)] or \
        [torch.cuda.current_device()]
    return {"cuda_allocated_mb": sum(torch.cuda.memory_allocated(d) for d in devices) // MB,
            "cuda_reserved_mb": sum(torch.cuda.memory_reserved(d) for d in devices) // MB,
            "cuda_peak_mb": sum(torch.cuda.max_memory_allocated(d) for d in devices) // MB,
            "cuda_free_mb": sum(torch.cuda.mem_get_info(d)[0] for d in used) // MB}


def release_cuda_cache(leftover_mb: int = 64) -> None:
    """Give torch's cached VRAM back to the driver. A full ``gc.collect()`` (0.2-0.3 s with
    torch and diffusers loaded) runs only when tensors are still allocated after that, i.e.
    when reference cycles hold some: the common move frees everything by reference count."""
    import torch

    torch.cuda.empty_cache()
    if torch.cuda.memory_allocated() // MB > leftover_mb:
        gc.collect()
        torch.cuda.empty_cache()


def cuda_free_mb(device: Any) -> int:
    """VRAM this process can still use on one device: the driver's free memory (other
    processes counted) plus what torch's caching allocator holds but no tensor uses."""
    import torch

    device = torch.device(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int((torch.cuda.mem_get_info(device)[0] + cached) // MB)


def module_bytes(module: Any) -> int:
    """Parameter and buffer bytes of a torch module."""
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    return total + sum(b.numel() * b.element_size() for b in module.buffers())


def pipeline_footprint_mb(pipe: Any) -> int:
    """Weights of every torch module in the pipeline, rounded up to whole MB."""
    import torch

    total = sum(module_bytes(c) for c in pipe.components.values()
                if isinstance(c, torch.nn.Module))
    return -(-total // MB)
