"""Tiny random-weight video pipelines, built here and saved with ``save_pretrained``: a Wan
text-to-video pipeline and an LTX image-to-video one (a few hundred KB each; 9 frames at
32×32 in 2 steps take a second or two on a CPU).

No hub access: the T5 tokenizer both use is a Unigram model over a small vocabulary made in
code (transformers' ``T5Tokenizer`` builds one from ``(piece, score)`` pairs). The image-to-
video one is LTX rather than Wan because ``WanImageToVideoPipeline`` needs ``ftfy`` to clean
its prompts, which this project does not install.
"""

from __future__ import annotations

import os
import string
from collections.abc import Callable
from pathlib import Path


def _tiny_t5_tokenizer():
    from transformers import T5Tokenizer

    chars = string.ascii_lowercase + string.digits + string.punctuation
    pieces = ["▁" + c for c in chars] + list(chars) + ["▁"]  # "▁": a word starts here
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(piece, -1.0 - i / 100) for i, piece in enumerate(pieces)]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=512)


def _t5_config(config_class: type, vocab_size: int):
    return config_class(vocab_size=vocab_size, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                        num_heads=4, relative_attention_num_buckets=8)


def build_tiny_video_pipeline(path: Path) -> Path:
    """Build and ``save_pretrained`` a random-weight ``WanPipeline`` (text-to-video: a
    ``WanTransformer3DModel``, an ``AutoencoderKLWan`` compressing time 4× and space 8×, a
    ``UMT5EncoderModel``) at ``path``. Frames come as 4k+1; sizes as multiples of 16."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = _tiny_t5_tokenizer()
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    text_encoder = UMT5EncoderModel(_t5_config(UMT5Config, len(tokenizer)))
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    pipe.save_pretrained(path, safe_serialization=True)
    return path


def build_tiny_i2v_pipeline(path: Path) -> Path:
    """Build and ``save_pretrained`` a random-weight ``LTXImageToVideoPipeline`` (image-to-
    video: an ``LTXVideoTransformer3DModel``, an ``AutoencoderKLLTXVideo`` compressing time
    and space 4×, a ``T5EncoderModel``) at ``path``."""
    import torch
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXImageToVideoPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    tokenizer = _tiny_t5_tokenizer()
    torch.manual_seed(0)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4,
        attention_head_dim=8, cross_attention_dim=32, num_layers=1, caption_channels=32)
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False),
        upsample_residual=(False, False, False, False), upsample_factor=(1, 1, 1, 1),
        timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
        decoder_causal=False)
    text_encoder = T5EncoderModel(_t5_config(T5Config, len(tokenizer)))
    pipe = LTXImageToVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                                   transformer=transformer,
                                   scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.save_pretrained(path, safe_serialization=True)
    return path


def shared_tiny_video(tmp_path_factory) -> Path:
    """The Wan text-to-video pipeline, built once per run however many test processes ask."""
    return _shared(tmp_path_factory, "shared-tiny-video", build_tiny_video_pipeline)


def shared_tiny_i2v(tmp_path_factory) -> Path:
    """The LTX image-to-video pipeline, built once per run however many test processes ask."""
    return _shared(tmp_path_factory, "shared-tiny-i2v", build_tiny_i2v_pipeline)


def _shared(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """As ``diffusion_fixtures.shared_tiny_sd``: the first process builds under a lock in the
    directory xdist's processes share, the rest load nothing."""
    from filelock import FileLock

    from workers.process import collector_paused

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (path / "model_index.json").exists():
            with collector_paused():  # torch, diffusers, transformers: a quarter less CPU
                build(root / f"{name}.partial")
            (root / f"{name}.partial").rename(path)
    return path
