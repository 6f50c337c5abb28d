"""Where a loaded model runs, the way ``ollama ps`` shows it: "100% GPU" only when every
layer is on a GPU, a CPU/GPU split for a partial offload, "100% CPU" for the CPU-RAM tier or
a worker without a GPU, and "(declared)" when the GPUs are declared (simulated) ones, whose
workers really run on the CPU. A pure function over numbers; the pool feeds it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class ProcessorSplit:
    """``size_mb``: the whole model (weights, cache, compute); ``vram_mb``: what of it is
    leased on GPUs; ``gpu_percent``: the share on GPUs; ``label``: as ``ollama ps`` shows;
    ``gpu_layers`` of ``total_layers`` on GPUs when only some are (else None)."""

    size_mb: int
    vram_mb: int
    gpu_percent: int
    declared: bool
    label: str
    gpu_layers: int | None = None
    total_layers: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def processor_split(*, tier: str, size_mb: int, leased_mb: int, gpu_layers: int | None,
                    total_layers: int | None, declared: bool, remote: bool = False
                    ) -> ProcessorSplit:
    """The split of one slot.

    ``tier``: gpu | cpu | disk (the slot's); ``leased_mb``: MB its VRAM lease holds;
    ``gpu_layers``: layers the worker puts on GPUs (-1 or None: all it has, when it has
    GPUs); ``total_layers``: the model's layer count when known; ``declared``: its GPUs
    are declared ones; ``remote``: a cloud model (nothing runs here)."""
    size_mb = max(size_mb, leased_mb, 0)
    if remote:
        return ProcessorSplit(0, 0, 0, False, "remote")
    if tier == "disk":
        return ProcessorSplit(size_mb, 0, 0, False, "-")
    if tier == "cpu" or leased_mb <= 0 or gpu_layers == 0:
        return ProcessorSplit(size_mb, 0, 0, False, "100% CPU")
    percent, layers = 100, None
    if gpu_layers is not None and gpu_layers >= 0 and total_layers \
            and gpu_layers < total_layers:
        # a model partly on the CPU is never shown as 100% GPU, however few layers stay
        percent = min(99, max(1, round(100 * gpu_layers / total_layers)))
        layers = gpu_layers
    label = "100% GPU" if percent == 100 else f"{100 - percent}%/{percent}% CPU/GPU"
    if declared:
        label += " (declared)"
    return ProcessorSplit(size_mb, leased_mb, percent, declared, label, layers,
                          total_layers if layers is not None else None)
