"""A tiny real LoRA for the tiny StableDiffusionPipeline of ``diffusion_fixtures``, made and
saved the way diffusers' own LoRA tests and training scripts do:

    peft's ``LoraConfig`` on the UNet's attention projections (``to_q``, ``to_k``, ``to_v``,
    ``to_out.0``), ``unet.add_adapter``, then ``StableDiffusionPipeline.save_lora_weights(
    folder, unet_lora_layers=get_peft_model_state_dict(unet))``

which writes ``<folder>/pytorch_lora_weights.safetensors`` (keys ``unet.<module>.lora_A.weight``
/ ``lora_B``) with the config as its metadata, as ``load_lora_weights`` reads it. peft starts
``lora_B`` at zeros (a fresh adapter changes nothing); here both matrices are drawn from the
seed, so the adapter changes the images and two seeds give two different adapters. The tiny
Wan text-to-video pipeline of ``video_fixtures`` gets one the same way, on its transformer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' name for a saved LoRA
TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # every attention's projections in the UNet
# how far the adapter moves a layer: its delta's spread relative to the layer's own weights
STRENGTH = 0.5


def build_tiny_sd_lora(path: Path, pipeline: Path, seed: int = 0, rank: int = 4) -> Path:
    """Write a rank-``rank`` LoRA for the UNet of the saved pipeline at ``pipeline`` into the
    folder ``path`` and return its weights file. Its weights are drawn from ``seed`` alone."""
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(pipeline / "unet", local_files_only=True)
    layers, metadata = _random_lora(unet, seed, rank)
    path.mkdir(parents=True, exist_ok=True)
    StableDiffusionPipeline.save_lora_weights(path, unet_lora_layers=layers,
                                              unet_lora_adapter_metadata=metadata)
    return path / LORA_FILE


def build_tiny_wan_lora(path: Path, pipeline: Path, seed: int = 0, rank: int = 4) -> Path:
    """The same for the transformer of a saved ``WanPipeline`` (``video_fixtures``): its
    attention projections bear the same names."""
    from diffusers import WanPipeline, WanTransformer3DModel

    transformer = WanTransformer3DModel.from_pretrained(pipeline / "transformer",
                                                        local_files_only=True)
    layers, metadata = _random_lora(transformer, seed, rank)
    path.mkdir(parents=True, exist_ok=True)
    WanPipeline.save_lora_weights(path, transformer_lora_layers=layers,
                                  transformer_lora_adapter_metadata=metadata)
    return path / LORA_FILE


def _random_lora(model, seed: int, rank: int) -> tuple[dict, dict]:
    """A LoRA on ``model``'s ``TARGETS`` with both matrices drawn from ``seed``: its layers'
    state dict (peft's, the adapter name left out) and its config as metadata."""
    import torch
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(TARGETS),
                        init_lora_weights=False)
    model.add_adapter(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            if not hasattr(module, "lora_A"):
                continue
            down, up = module.lora_A["default"].weight, module.lora_B["default"].weight
            # delta = up @ down: about STRENGTH of the base weights' own spread per entry
            scale = STRENGTH * float(module.base_layer.weight.std()) / rank ** 0.5
            down.copy_(torch.randn(down.shape, generator=generator))
            up.copy_(torch.randn(up.shape, generator=generator) * scale)
            assert up.abs().sum() > 0, name
    # the metadata keeps rank and alpha, so the adapter loads at the scale it was made with
    return get_peft_model_state_dict(model), {**config.to_dict(), "base_model_name_or_path": None}


def shared_tiny_sd_lora(tmp_path_factory, name: str, seed: int, rank: int = 4) -> Path:
    """The LoRA ``name`` (drawn from ``seed``) for the shared tiny pipeline, built once per
    run however many test processes ask (under a lock in the directory xdist's processes
    share, as ``shared_tiny_sd``). Returns its weights file."""
    from tests.diffusion_fixtures import shared_tiny_sd

    pipeline = shared_tiny_sd(tmp_path_factory)
    return _shared(tmp_path_factory, f"sd-lora-{name}",
                   lambda folder: build_tiny_sd_lora(folder, pipeline, seed=seed, rank=rank))


def shared_tiny_wan_lora(tmp_path_factory, name: str, seed: int, rank: int = 4) -> Path:
    """The LoRA ``name`` for the shared tiny Wan text-to-video pipeline, as above."""
    from tests.video_fixtures import shared_tiny_video

    pipeline = shared_tiny_video(tmp_path_factory)
    return _shared(tmp_path_factory, f"wan-lora-{name}",
                   lambda folder: build_tiny_wan_lora(folder, pipeline, seed=seed, rank=rank))


def _shared(tmp_path_factory, key: str, build: Callable[[Path], Path]) -> Path:
    from filelock import FileLock

    from workers.process import collector_paused

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / f"shared-tiny-{key}"
    with FileLock(str(root / f"shared-tiny-{key}.lock")):
        if not (path / LORA_FILE).exists():
            partial = root / f"shared-tiny-{key}.partial"
            with collector_paused():
                build(partial)
            partial.rename(path)
    return path / LORA_FILE
