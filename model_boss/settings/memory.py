"""The GPUs and the memory the pool may use: VRAM margins, leases, the CPU-RAM tier."""

from __future__ import annotations

from pydantic import BaseModel, Field


class DeclaredGPU(BaseModel):
    """A GPU declared in settings, used when NVML finds none (or to simulate a box)."""

    index: int = Field(ge=0)
    name: str = "declared"
    vram_mb: int = Field(gt=0)


class MemorySettings(BaseModel):
    """Which GPUs there are, what is kept free on them and in RAM, and their leases."""

    gpus: list[DeclaredGPU] = Field(default_factory=list)
    use_nvml: bool = True
    reclaim_sleep_s: float = Field(default=2.0, ge=0)
    vram_margin_mb: int = Field(default=512, ge=0)
    lease_ttl_s: float = Field(default=30.0, gt=0)
    ram_reserve_mb: int = Field(default=4096, ge=0)
    max_offloaded_mb: int | None = Field(default=None, ge=0)
