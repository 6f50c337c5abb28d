"""Loading a pipeline: ``from_pretrained`` from local files, then weights placed per
``--offload``. The result is a frozen ``LoadedPipeline`` the holder keeps."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from ..pipeline_kinds import PipelineKind, pipeline_kind
from .loras import attach_loras
from .memory import Offload, pipeline_footprint_mb, place_weights, torch_dtype
from .options import WorkerOptions
from .references import adapter_files, attach_ip_adapter

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
    ip_adapter: str | None = None  # the attached IP-Adapter's weights file: references work
    loras: tuple[str, ...] = ()  # the LoRA adapters' names (--lora), all off until asked for

    @property
    def kind(self) -> PipelineKind:
        """What it makes, from its class name: ``POST /generate`` serves images, ``POST
        /video`` videos (``workers.pipeline_kinds``)."""
        return pipeline_kind(type(self.pipe).__name__)


class LoadProgress:
    """How far :func:`load_pipeline` is, for ``GET /health`` while loading: the pipeline's
    components loaded so far out of all of them, counted off diffusers' own loading loop."""

    def __init__(self) -> None:
        self.components = 0  # 0 until diffusers knows how many
        self.loaded = 0
        self.placing = False  # from_pretrained done; weights moving to the device

    def to_dict(self) -> dict[str, Any]:
        fraction = self.loaded / self.components if self.components else None
        return {"stage": "loading", "fraction": fraction, "components": self.components,
                "components_loaded": self.loaded, "placing_weights": self.placing}

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """While loading, diffusers' "Loading pipeline components" loop (its tqdm call) is
        counted here; every other progress bar is left as it is."""
        from diffusers.utils import logging as diffusers_logging

        original = diffusers_logging.tqdm

        def counted(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
            if iterable is None or not str(kwargs.get("desc", "")).startswith(
                    "Loading pipeline components"):
                return original(iterable, *args, **kwargs)
            return self._count(list(iterable))

        diffusers_logging.tqdm = counted
        try:
            yield
        finally:
            diffusers_logging.tqdm = original

    def _count(self, items: list[Any]) -> Iterator[Any]:
        self.components = len(items)
        for done, item in enumerate(items):
            self.loaded = done
            yield item  # the loop body loads this component
        self.loaded = len(items)


def load_pipeline(opts: WorkerOptions, progress: LoadProgress | None = None) -> LoadedPipeline:
    """``from_pretrained`` (local files only), then place the weights per ``opts.offload``;
    ``progress`` follows the components as they load. A folder with no ``model_index.json``
    fails at once, before seconds of importing torch and diffusers to find the same."""
    if os.path.isdir(opts.model) and not os.path.isfile(
            os.path.join(opts.model, "model_index.json")):
        raise OSError(f"no file named model_index.json in {opts.model}: not a diffusers "
                      "pipeline folder (save_pretrained writes one)")
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
    progress = progress if progress is not None else LoadProgress()
    with progress.counting():
        pipe = DiffusionPipeline.from_pretrained(opts.model, **kwargs)
    # before placement: the encoder and adapter layers move, and count, with the pipeline
    ip_adapter = attach_ip_adapter(pipe, adapter_files(
        opts.ip_adapter, opts.ip_adapter_image_encoder)) if opts.ip_adapter else None
    loras = attach_loras(pipe, opts.loras)  # loaded, then switched off
    progress.placing = True
    pipe.set_progress_bar_config(disable=True)
    footprint_mb = pipeline_footprint_mb(pipe)
    hooks = place_weights(pipe, device, offload, notes)
    loaded = LoadedPipeline(
        pipe=pipe, device=device, dtype=str(dtype).removeprefix("torch."), hooks=hooks,
        footprint_mb=footprint_mb, load_s=round(time.monotonic() - started, 3),
        ready_s=round(time.time() - psutil.Process().create_time(), 3),
        call_params=frozenset(inspect.signature(pipe.__call__).parameters), notes=tuple(notes),
        ip_adapter=ip_adapter, loras=loras)
    log.info("loaded %s in %.2fs on %s (%s, offload %s), footprint %s MB", opts.model,
             loaded.load_s, device, loaded.dtype, offload, footprint_mb)
    return loaded


def preimport() -> None:
    """What a spare imports ahead of its model: torch, diffusers' pipeline loader and the
    modules a Stable Diffusion family pipeline pulls in (transformers' CLIP, the UNet and VAE
    classes). Touches no CUDA API, so ``CUDA_VISIBLE_DEVICES`` set at ``POST /load`` still
    decides which GPUs the worker sees."""
    import torch  # noqa: F401
    from diffusers import (  # noqa: F401
        AutoencoderKL,
        DiffusionPipeline,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextModel, CLIPTokenizer  # noqa: F401

    _dtype_kwarg()
    _warm_transformers()


def _warm_transformers() -> None:
    """transformers builds its table of checkpoint renamings (hundreds of regexes, 0.7 s here)
    at a process's first ``from_pretrained`` of one of its models; a spare builds it ahead.
    Best effort: a transformers without that table has nothing to warm."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return
    get_checkpoint_conversion_mapping("clip")


def _dtype_kwarg() -> str:
    """``dtype`` where this diffusers takes it (``torch_dtype`` is deprecated there), else
    ``torch_dtype``: an older diffusers would silently ignore ``dtype`` and load float32."""
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_TORCH_DTYPE_DEPRECATION_MESSAGE") \
        else "torch_dtype"
