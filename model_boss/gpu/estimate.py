"""VRAM estimation chain: the first rung that answers wins, and says which rung it was."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..catalog.manifest import KV_CACHE_BYTES, BackendKind, ModelManifest
from .gguf_info import FitProjection, llama_fit, read_gguf_info
from .placement import LayerCosts, Placement, fixed_layers
from .safetensors_info import OVERHEAD, BlockLayout, layer_costs_mb, model_layers, read_headers

GGUF_FACTOR = 1.1
SAFETENSORS_FACTOR = 1.3
_PARAMS = re.compile(r"(?<![a-z0-9])(\d+(?:\.\d+)?)\s*([bm])(?![a-z])", re.IGNORECASE)
_QUANT_BYTES = {  # bytes per parameter by quantisation tag in a file name
    "q2": 0.35, "q3": 0.45, "q4": 0.6, "q5": 0.7, "q6": 0.82, "q8": 1.07,
    "f16": 2.0, "fp16": 2.0, "bf16": 2.0, "f32": 4.0, "fp32": 4.0,
}


@dataclass(frozen=True, slots=True)
class VramEstimate:
    mb: int
    rung: str  # measured | manifest | llama.cpp-fit | file | file_size | name | default
    detail: str = ""
    # the whole model's figure when ``mb`` covers only the layers kept on the GPU
    whole_mb: int | None = None

    def to_dict(self) -> dict:
        whole = {} if self.whole_mb is None else {"whole_mb": self.whole_mb}
        return {"mb": self.mb, "rung": self.rung, "detail": self.detail, **whole}


def _dir_size(path: Path, suffixes: tuple[str, ...]) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)


def from_file_size(path: Path | None) -> VramEstimate | None:
    """GGUF size × 1.1, safetensors (file or directory of them) × 1.3."""
    if path is None or not path.exists():
        return None
    if path.is_file() and path.suffix == ".gguf":
        size = path.stat().st_size
        return VramEstimate(int(size * GGUF_FACTOR / 2**20) + 1, "file_size",
                            f"{size} bytes GGUF x {GGUF_FACTOR}")
    if path.is_dir():
        size = _dir_size(path, (".safetensors", ".bin"))
    elif path.suffix in (".safetensors", ".bin"):
        size = path.stat().st_size
    else:
        return None
    if size == 0:
        return None
    return VramEstimate(int(size * SAFETENSORS_FACTOR / 2**20) + 1, "file_size",
                        f"{size} bytes of weights x {SAFETENSORS_FACTOR}")


def from_name(name: str) -> VramEstimate | None:
    """"llama-7b-q4_k_m" → 7e9 parameters × 0.6 bytes; no size in the name → None."""
    match = _PARAMS.search(name)
    if not match:
        return None
    count = float(match.group(1)) * (1e9 if match.group(2).lower() == "b" else 1e6)
    lowered = name.lower()
    per_param = next((b for tag, b in _QUANT_BYTES.items() if tag in lowered), 2.0)
    mb = int(count * per_param * 1.2 / 2**20) + 1
    return VramEstimate(mb, "name", f"{match.group(0)} params x {per_param} B x 1.2")


def from_file(manifest: ModelManifest, path: Path) -> VramEstimate | None:
    """The file's own metadata: GGUF tensors + KV cache + compute; safetensors headers."""
    if path.is_file() and path.suffix == ".gguf":
        info = read_gguf_info(path)
        if info is None or info.block_count == 0:
            return None
        kv = info.kv_bytes(manifest.ctx_size, k_bytes=KV_CACHE_BYTES[manifest.cache_type_k],
                           v_bytes=KV_CACHE_BYTES[manifest.cache_type_v])
        compute = info.compute_bytes()
        total = info.total_bytes + kv + compute
        return VramEstimate(
            int(total / 2**20) + 1, "file",
            f"weights {info.total_bytes / 2**20:.0f} MB + KV ({kv_text(manifest)}) "
            f"{kv / 2**20:.0f} MB + compute {compute / 2**20:.0f} MB")
    weights = safetensors_bytes(path)
    if weights:
        overhead = 1.2
        return VramEstimate(int(weights * overhead / 2**20) + 1, "file",
                            f"safetensors headers {weights / 2**20:.0f} MB x {overhead}")
    return None


def kv_text(manifest: ModelManifest) -> str:
    """"f16 for ctx 4096 shared by 4 slots": what the KV figure covers."""
    types = manifest.cache_type_k if manifest.cache_type_k == manifest.cache_type_v \
        else f"{manifest.cache_type_k}/{manifest.cache_type_v}"
    slots = manifest.concurrency
    shared = f" shared by {slots} slots" if slots > 1 else ""
    return f"{types} for ctx {manifest.ctx_size}{shared}"


def from_llama_fit(manifest: ModelManifest, path: Path,
                   probe=llama_fit) -> VramEstimate | None:
    """llama.cpp's own projection (its parameter fitting, nothing allocated) for this file,
    context, slots and cache types. A CPU build projects host buffers: its compute buffer is
    the CPU's, so the GPU compute estimate of :meth:`GGUFInfo.compute_bytes` stands in when
    larger."""
    if manifest.backend != BackendKind.LLAMA_SERVER or path.suffix != ".gguf":
        return None
    fit: FitProjection | None = probe(path, ctx_size=manifest.ctx_size,
                                      parallel=manifest.concurrency,
                                      cache_type_k=manifest.cache_type_k,
                                      cache_type_v=manifest.cache_type_v,
                                      flash_attn=manifest.flash_attention)
    if fit is None:
        return None
    compute, note = fit.compute_mb, ""
    info = read_gguf_info(path)
    if fit.host_only and info is not None:
        gpu_compute = int(info.compute_bytes() / 2**20) + 1
        if gpu_compute > compute:
            compute, note = gpu_compute, f" (llama.cpp's CPU figure {fit.compute_mb} MB)"
    total = fit.model_mb + fit.context_mb + compute
    return VramEstimate(
        total, "llama.cpp-fit",
        f"llama.cpp on {'/'.join(fit.devices)}: model {fit.model_mb} MB + context "
        f"{fit.context_mb} MB (KV {kv_text(manifest)}) + compute {compute} MB{note}")


def safetensors_bytes(path: Path) -> int:
    """Tensor bytes from the JSON headers of a .safetensors file or a directory of them."""
    return sum(read_headers(path).values())


def estimate_vram(
    manifest: ModelManifest,
    path: Path | None,
    *,
    measured_mb: int | None = None,
    fit_estimator=from_llama_fit,
    file_estimator=from_file,
) -> VramEstimate:
    """measured → manifest ``vram_mb`` → llama.cpp's own projection (GGUF with the
    ``xllamacpp`` package) → the file's own metadata → file size → name → 1 GB. A
    transformers model whose manifest keeps ``gpu_layers`` of its layers on the GPU is
    estimated at that count (:func:`resident`); ``measured_mb`` is then the figure measured
    at that count."""
    if measured_mb:
        return VramEstimate(int(measured_mb), "measured", "reported after a previous load")
    if manifest.vram_mb:
        return VramEstimate(manifest.vram_mb, "manifest", "vram_mb in the manifest")
    whole = _whole(manifest, path, fit_estimator, file_estimator)
    layers = fixed_layers(manifest.gpu_layers)
    if layers is None or manifest.backend != BackendKind.TRANSFORMERS:
        return whole
    return resident(whole, model_layers(path), layers, manifest.offload_prefetch)


def _whole(manifest: ModelManifest, path: Path | None, fit_estimator,
           file_estimator) -> VramEstimate:
    if fit_estimator is not None and path is not None:
        projected = fit_estimator(manifest, path)
        if projected is not None:
            return projected
    if file_estimator is not None and path is not None:
        found = file_estimator(manifest, path)
        if found is not None:
            return found
    for rung in (from_file_size(path), from_name(Path(manifest.path or "").name),
                 from_name(manifest.id)):
        if rung is not None:
            return rung
    return VramEstimate(1024, "default", "nothing known; assumed 1 GB")


def resident(whole: VramEstimate, layout: BlockLayout | None, gpu_layers: int,
             prefetch: bool) -> VramEstimate:
    """What a transformers model leases with ``gpu_layers`` of its repeated blocks on the
    GPU and the others streamed from CPU RAM, from its safetensors headers: the other
    weights and the resident blocks with 20 % for activations, and the staging room of the
    streamed ones (the block in use, and with ``prefetch`` the next one arriving): the rule
    the planner's partial placement leases by (safetensors_info.layer_costs_mb). ``whole``
    when every block stays, or the model has no repeated blocks."""
    if layout is None or gpu_layers >= layout.count:
        return whole
    per_layer, fixed = layer_costs_mb(layout, prefetch)
    costs = LayerCosts(per_layer, fixed, layout.count)
    staged = 2 if prefetch else 1
    other = layout.other_bytes * OVERHEAD / 2**20
    staging = layout.largest_block * staged / 2**20
    return VramEstimate(
        costs.mb(gpu_layers), "file",
        f"{gpu_layers} of {layout.count} layers on the GPU, {layout.count - gpu_layers} "
        f"streamed from CPU RAM: other weights {other:.0f} MB + {gpu_layers} layers "
        f"{gpu_layers * per_layer:.0f} MB (weights x{OVERHEAD} for activations) + staging "
        f"for {staged} layer{'s' * (staged > 1)}{' (prefetch)' * prefetch} {staging:.0f} MB; "
        f"the whole model: {whole.mb} MB ({whole.detail or whole.rung})",
        whole_mb=whole.mb)


def placed(whole: VramEstimate, placement: Placement | None,
           layout: BlockLayout | None = None, prefetch: bool = True) -> VramEstimate:
    """The estimate a slot shows once ``placement`` is made: ``whole``, unless only some of
    its layers went on the GPU (a partial placement), then what they lease: for a
    transformers model (its ``layout`` given) :func:`resident`'s figure, else (a GGUF under
    llama.cpp) the lease the planner sized from its per-layer costs."""
    if placement is None or placement.gpu_layers is None or not placement.total_layers:
        return whole
    layers, total = placement.gpu_layers, placement.total_layers
    if whole.whole_mb is not None:  # a manifest's own count, placed at another
        whole = VramEstimate(whole.whole_mb, whole.rung, "safetensors headers")
    if layout is not None and layout.count == total:
        return resident(whole, layout, layers, prefetch)
    return VramEstimate(sum(placement.allocations.values()), whole.rung,
                        f"{layers} of {total} layers on the GPU, the rest on the CPU: what "
                        f"the partial placement leases; the whole model: {whole.mb} MB "
                        f"({whole.detail or whole.rung})", whole_mb=whole.mb)


def with_companions(estimate: VramEstimate, files: list[Path]) -> VramEstimate:
    """``estimate`` plus what rides in the same worker: its LoRA adapters, its draft model, a
    pipeline's IP-Adapter and image encoder (their files' sizes: weights as on disk). A
    measured figure has them already, and a manifest's ``vram_mb`` is the user's word for
    the whole."""
    if estimate.rung in ("measured", "manifest") or not files:
        return estimate
    extra = sum(sum(p.stat().st_size for p in f.rglob("*") if p.is_file()) if f.is_dir()
                else f.stat().st_size for f in files if f.exists()) // (1024 * 1024)
    return VramEstimate(estimate.mb + extra, estimate.rung,
                        f"{estimate.detail}; + {extra} MB for {len(files)} adapter, draft or "
                        f"encoder file{'s' * (len(files) != 1)}")
