"""GPU inventory: NVML when NVIDIA GPUs exist, else the GPUs declared in settings."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

DEFAULT_DECLARED_MB = 8192


@dataclass(frozen=True, slots=True)
class GPUInfo:
    index: int
    name: str
    vram_mb: int
    source: str  # "nvml" | "declared"

    def to_dict(self) -> dict:
        return asdict(self)


class NvmlProbe:
    """Thin wrapper over pynvml; the one seam for reading real GPU memory."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()

    def gpus(self) -> list[GPUInfo]:
        nv = self._nvml
        found = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            name = nv.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            total = nv.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            found.append(GPUInfo(index, name, int(total), "nvml"))
        return found

    def free_mb(self, index: int) -> int:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).free // (1024 * 1024))

    def process_used_mb(self, index: int, pids: set[int]) -> int | None:
        """VRAM used on GPU ``index`` by any of ``pids`` (None when NVML cannot tell)."""
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError:
            return None
        used = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory]
        return int(sum(used) // (1024 * 1024)) if used else None


def open_nvml() -> NvmlProbe | None:
    """An NVML probe when a driver and at least one GPU exist, else None."""
    try:
        probe = NvmlProbe()
        if probe.gpus():
            return probe
    except Exception as exc:  # no driver, no library, no device: all mean "no NVML"
        log.debug("NVML not available: %s", exc)
    return None


def discover_gpus(declared: list, nvml: NvmlProbe | None) -> list[GPUInfo]:
    """NVML GPUs when present; else declared ones; else one declared 8192 MB GPU."""
    if nvml is not None:
        return nvml.gpus()
    if declared:
        return [GPUInfo(g.index, g.name, g.vram_mb, "declared") for g in declared]
    return [GPUInfo(0, "declared-8g", DEFAULT_DECLARED_MB, "declared")]


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """One GPU as the scheduler sees it right now."""

    index: int
    name: str
    capacity_mb: int
    leased_mb: int
    free_mb: int  # effective: min(capacity - leased - margin, NVML free - margin), >= 0
    nvml_free_mb: int | None
    source: str
    reserve_mb: int = 0  # kept back from every lease (vram_margin_mb): FREE leaves it out

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "capacity_mb": self.capacity_mb,
            "leased_mb": self.leased_mb,
            "free_mb": self.free_mb,
            "nvml_free_mb": self.nvml_free_mb,
            "source": self.source,
            "reserve_mb": self.reserve_mb,
        }
