"""Placement: which GPUs a model goes on and how it is split. Pure functions over numbers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a model goes. ``allocations`` = GPU index → MB to lease there."""

    allocations: dict[int, int]
    kind: str  # single | split | partial
    tensor_split: tuple[float, ...] = ()
    gpu_layers: int | None = None  # None = all layers
    total_layers: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> list[int]:
        return sorted(self.allocations)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(i) for i in self.gpus)

    @property
    def share(self) -> str:
        """CPU/GPU share the way ``ollama ps`` shows it: "100% GPU" or "48%/52% CPU/GPU"."""
        if self.gpu_layers is None or not self.total_layers:
            return "100% GPU"
        gpu = round(100 * self.gpu_layers / self.total_layers)
        return f"{100 - gpu}%/{gpu}% CPU/GPU"

    def to_dict(self) -> dict:
        return {
            "allocations": {str(k): v for k, v in self.allocations.items()},
            "kind": self.kind,
            "tensor_split": list(self.tensor_split),
            "gpu_layers": self.gpu_layers,
            "total_layers": self.total_layers,
            "share": self.share,
            "notes": list(self.notes),
        }


def layers_on_gpu(placement: Placement | None, wanted: int | str) -> int:
    """A worker's layers on the GPU: 0 without one, the pool's count for a partial offload,
    else the manifest's ``gpu_layers`` (``auto`` = all, -1)."""
    if placement is None or not placement.gpus:
        return 0
    if placement.gpu_layers is not None:
        return placement.gpu_layers
    return -1 if wanted == "auto" else int(wanted)


def fixed_layers(wanted: int | str) -> int | None:
    """A manifest's own ``gpu_layers`` when it is a count (``auto`` and -1, all: None)."""
    return wanted if isinstance(wanted, int) and wanted >= 0 else None


def partial_layers(placement: Placement | None, wanted: int | str) -> int | None:
    """The layers a worker keeps on its GPU when it holds only some of its model's there
    (:func:`layers_on_gpu`'s count); None when the model is whole where it runs (every layer
    on the GPU, or no GPU at all). A model's learned figures are kept by this count."""
    if placement is None or not placement.gpus:
        return None
    layers = layers_on_gpu(placement, wanted)
    if layers < 0 or (placement.total_layers is not None and layers >= placement.total_layers):
        return None
    return layers


def place_single(need_mb: int, free_mb: dict[int, int]) -> Placement | None:
    """The one GPU with the most effective free VRAM, if the model fits there."""
    if not free_mb:
        return None
    best = max(free_mb, key=lambda i: (free_mb[i], -i))
    if free_mb[best] >= need_mb:
        return Placement({best: need_mb}, "single")
    return None


def place_split(need_mb: int, free_mb: dict[int, int]) -> Placement | None:
    """A split proportional to each GPU's effective free VRAM, if all together hold it."""
    usable = {i: mb for i, mb in sorted(free_mb.items()) if mb > 0}
    total = sum(usable.values())
    if len(usable) < 2 or total < need_mb:
        return None
    allocations: dict[int, int] = {}
    remaining = need_mb
    indices = sorted(usable)
    for position, index in enumerate(indices):
        last = position == len(indices) - 1
        share = remaining if last else round(need_mb * usable[index] / total)
        share = min(share, usable[index])
        allocations[index] = share
        remaining -= share
    if remaining > 0:
        return None
    allocations = {i: mb for i, mb in allocations.items() if mb > 0}
    ratios = tuple(round(allocations.get(i, 0) / need_mb, 4) for i in indices
                   if i in allocations)
    return Placement(allocations, "split", tensor_split=ratios)


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """For partial offload: MB per layer on the GPU, MB that go to the GPU regardless."""

    per_layer_mb: float
    fixed_mb: float
    total_layers: int
    min_gpu_layers: int = 0
    max_gpu_layers: int | None = None  # a manifest's own count: never more (None: all but one)

    def mb(self, layers: int) -> int:
        """What ``layers`` resident layers lease."""
        return int(self.fixed_mb + layers * self.per_layer_mb) + 1

    def most_layers(self, room_mb: float) -> int:
        """The most layers (fewer than all, at most ``max_gpu_layers``) ``room_mb`` holds."""
        cap = self.total_layers - 1
        if self.max_gpu_layers is not None:
            cap = min(cap, self.max_gpu_layers)
        room = room_mb - self.fixed_mb
        return max(0, min(cap, int(room // self.per_layer_mb))) if room > 0 else 0


def place_partial(free_mb: dict[int, int], costs: LayerCosts) -> Placement | None:
    """The largest number of layers (0 < k < all) that fits on the GPU with most room."""
    if not free_mb or costs.total_layers < 2 or costs.per_layer_mb <= 0:
        return None
    best = max(free_mb, key=lambda i: (free_mb[i], -i))
    layers = costs.most_layers(free_mb[best])
    if layers < max(1, costs.min_gpu_layers):
        return None
    return Placement({best: min(costs.mb(layers), free_mb[best])}, "partial",
                     gpu_layers=layers, total_layers=costs.total_layers,
                     notes=[f"{layers}/{costs.total_layers} layers on GPU {best}"])


def fewer_layers(placement: Placement, layers: int, costs: LayerCosts,
                 room_mb: dict[int, int], why: str) -> Placement | None:
    """``placement`` (``layers`` of the model's on its one GPU) re-placed at the layers that
    fit ``room_mb`` there (the VRAM the GPU really has for it: its lease, less what the worker
    found missing): fewer than now, never fewer than ``min_gpu_layers`` nor none; None when no
    such count fits. The lease stays as it was; the note says why the count went down."""
    if len(placement.allocations) != 1:
        return None
    gpu, leased = next(iter(placement.allocations.items()))
    fits = min(layers - 1, costs.most_layers(min(leased, room_mb.get(gpu, 0))))
    if fits < max(1, costs.min_gpu_layers):
        return None
    return Placement(dict(placement.allocations), "partial", gpu_layers=fits,
                     total_layers=costs.total_layers,
                     notes=[f"{fits}/{costs.total_layers} layers on GPU {gpu}, lowered from "
                            f"{layers}: {why}"])


def place(need_mb: int, free_mb: dict[int, int], *, allow_split: bool = True,
          partial: LayerCosts | None = None) -> Placement | None:
    """Single GPU first; else a proportional split across GPUs; else (when ``partial`` is
    given) as many layers as fit on one GPU; else None."""
    return (place_single(need_mb, free_mb)
            or (place_split(need_mb, free_mb) if allow_split else None)
            or (place_partial(free_mb, partial) if partial is not None else None))
