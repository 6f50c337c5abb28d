"""A tiny random-weight StableDiffusionPipeline, built here and saved with save_pretrained.

No hub access: the CLIP tokenizer is built from a small vocabulary written to disk.
"""

from __future__ import annotations

import json
import os
import string
import tempfile
from pathlib import Path


def _tiny_tokenizer(workdir: Path):
    from transformers import CLIPTokenizer

    letters = string.ascii_lowercase + string.digits + string.punctuation
    tokens = ["<|startoftext|>", "<|endoftext|>"]
    tokens += list(letters) + [c + "</w>" for c in letters]
    (workdir / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (workdir / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(workdir / "vocab.json"), str(workdir / "merges.txt"),
                         model_max_length=32)


def build_tiny_sd_pipeline(path: Path, width: int = 32) -> Path:
    """Build and ``save_pretrained`` a random-weight StableDiffusionPipeline at ``path``
    (~7 MB at ``width=32``; ``width=256`` gives a few hundred MB for benchmarks)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(width, width * 2), layers_per_block=1, sample_size=8, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=32)
    vae = AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), latent_channels=4,
        norm_num_groups=32, sample_size=32)
    _as_trained(vae)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32, intermediate_size=37,
        layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, vocab_size=200,
        max_position_embeddings=32, projection_dim=32))
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = _tiny_tokenizer(Path(tmp))
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="scaled_linear", clip_sample=False,
                                  set_alpha_to_one=False, steps_offset=1)
        pipe = StableDiffusionPipeline(
            unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
            scheduler=scheduler, safety_checker=None, feature_extractor=None,
            image_encoder=None, requires_safety_checker=False)
        pipe.save_pretrained(path, safe_serialization=True)
    return path


def _as_trained(vae) -> None:
    """Give a random VAE the two properties a trained one has and the pipelines rely on: a
    near-certain encoding (its posterior's variance at the floor diffusers clamps to, so an
    image-to-image edit starts from the picture, not from noise around it) and a
    ``scaling_factor`` that brings its latents to unit variance (what 0.18215 does for Stable
    Diffusion's), so a little denoising moves them a little."""
    import torch

    channels = vae.config.latent_channels
    with torch.no_grad():
        vae.quant_conv.weight[channels:] = 0
        vae.quant_conv.bias[channels:] = -30.0
        pictures = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
        spread = float(vae.encode(pictures).latent_dist.mean.std())
    vae.register_to_config(scaling_factor=round(1 / spread, 4))


def shared_tiny_sd(tmp_path_factory) -> Path:
    """The width-32 pipeline, built once per run however many test processes ask: the first
    builds it under a lock in the directory xdist's processes share, the rest load nothing
    (building imports diffusers and transformers, seconds of CPU in each process)."""
    from filelock import FileLock

    from workers.process import collector_paused

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "shared-tiny-sd"
    with FileLock(str(root / "shared-tiny-sd.lock")):
        if not (path / "model_index.json").exists():
            with collector_paused():  # torch, diffusers, transformers: a quarter less CPU
                build_tiny_sd_pipeline(root / "shared-tiny-sd.partial")
            (root / "shared-tiny-sd.partial").rename(path)
    return path
