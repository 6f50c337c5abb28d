"""Loading a pipeline: ``from_pretrained`` from local files, then weights placed per
``--offload``. The result is a frozen ``LoadedPipeline`` the holder keeps."""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any

import psutil

from .memory import Offload, pipeline_footprint_mb, place_weights, torch_dtype
from .options import WorkerOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedPipeline:
    """A loaded pipeline and what was learned while loading it."""

    pipe: Any
    device: str  # "cuda" or "cpu": where it computes
    dtype: str
    hooks: Offload | None  # the diffusers offload that owns weight placement, if any
    footprint_mb: int
    load_s: float  # from_pretrained and placement
    ready_s: float  # since the process started: a cold start as the coordinator sees it
    call_params: frozenset[str]  # the arguments this pipeline's __call__ takes
    notes: tuple[str, ...] = ()


def load_pipeline(opts: WorkerOptions) -> LoadedPipeline:
    """``from_pretrained`` (local files only), then place the weights per ``opts.offload``."""
    import torch
    from diffusers import DiffusionPipeline

    notes: list[str] = []
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda and opts.device != "cpu" else "cpu"
    if opts.device == "cuda" and not cuda:
        notes.append("--device cuda asked but CUDA is not available; using the CPU")
    dtype = torch_dtype(opts.dtype, device)
    if dtype == torch.float16 and device == "cpu":
        notes.append("float16 on the CPU is slow and some kernels are missing")
    kwargs: dict[str, Any] = {_dtype_kwarg(): dtype, "local_files_only": True}
    offload = opts.offload
    if offload is not Offload.NONE and device != "cuda":
        notes.append(f"offload '{offload}' needs CUDA; running on the CPU instead")
    if offload is Offload.BALANCED and device == "cuda":
        kwargs["device_map"] = "balanced"
        if opts.max_memory:
            kwargs["max_memory"] = opts.max_memory
    started = time.monotonic()
    pipe = DiffusionPipeline.from_pretrained(opts.model, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    footprint_mb = pipeline_footprint_mb(pipe)
    hooks = place_weights(pipe, device, offload, notes)
    loaded = LoadedPipeline(
        pipe=pipe, device=device, dtype=str(dtype).removeprefix("torch."), hooks=hooks,
        footprint_mb=footprint_mb, load_s=round(time.monotonic() - started, 3),
        ready_s=round(time.time() - psutil.Process().create_time(), 3),
        call_params=frozenset(inspect.signature(pipe.__call__).parameters), notes=tuple(notes))
    log.info("loaded %s in %.2fs on %s (%s, offload %s), footprint %s MB", opts.model,
             loaded.load_s, device, loaded.dtype, offload, footprint_mb)
    return loaded


def _dtype_kwarg() -> str:
    """``dtype`` where this diffusers takes it (``torch_dtype`` is deprecated there), else
    ``torch_dtype``: an older diffusers would silently ignore ``dtype`` and load float32."""
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_TORCH_DTYPE_DEPRECATION_MESSAGE") \
        else "torch_dtype"
