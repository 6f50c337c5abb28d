"""Memory decisions for the diffusers worker: pure functions over numbers, plus probes."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

PIXELS_512 = 512 * 512


@dataclass(frozen=True, slots=True)
class VaeDecision:
    """Where and how to run the VAE decode for one request."""

    mode: str  # gpu | tiled | cpu | cpu-device
    estimated_mb: int
    free_mb: int | None
    reason: str

    def to_dict(self) -> dict:
        return {"vae": self.mode, "estimated_decode_mb": self.estimated_mb,
                "free_mb": self.free_mb, "reason": self.reason}


def decode_estimate_mb(width: int, height: int, mb_per_512px: float) -> int:
    """Decode memory grows linearly with the pixel count: coefficient × pixels / 512²."""
    return int(round(mb_per_512px * width * height / PIXELS_512))


def decide_vae(width: int, height: int, mb_per_512px: float, free_mb: int | None,
               margin_mb: int, allow_cpu: bool) -> VaeDecision:
    """Decode on the GPU when it fits; else tiled (tiles cost about one 512×512 decode);
    else on the CPU when allowed; with no GPU at all, everything is on the CPU already."""
    need = decode_estimate_mb(width, height, mb_per_512px)
    if free_mb is None:
        return VaeDecision("cpu-device", need, None, "no CUDA device: the pipeline runs on "
                                                     "the CPU")
    room = free_mb - margin_mb
    if need <= room:
        return VaeDecision("gpu", need, free_mb, f"{need} MB fits in {room} MB free")
    tiled = min(need, int(round(mb_per_512px)))
    if tiled <= room:
        return VaeDecision("tiled", need, free_mb,
                           f"{need} MB does not fit in {room} MB; tiles need ~{tiled} MB")
    if allow_cpu:
        return VaeDecision("cpu", need, free_mb,
                           f"even tiles (~{tiled} MB) do not fit in {room} MB; decoding on CPU")
    return VaeDecision("tiled", need, free_mb,
                       f"tiles (~{tiled} MB) may not fit in {room} MB and CPU decode is off; "
                       "trying tiled")


def rss_mb() -> int:
    return int(psutil.Process(os.getpid()).memory_info().rss // 2**20)


def module_bytes(module) -> int:
    """Parameter and buffer bytes of a torch module."""
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    return total + sum(b.numel() * b.element_size() for b in module.buffers())


def pipeline_footprint_mb(pipe) -> int:
    import torch

    total = 0
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            total += module_bytes(component)
    return int(total // 2**20) + 1
