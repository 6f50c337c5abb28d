"""A tiny random-weight IP-Adapter for the tiny StableDiffusionPipeline of
``diffusion_fixtures``, in the layout diffusers' ``load_ip_adapter`` reads:

    <folder>/ip-adapter.safetensors   flattened ``image_proj.*`` and ``ip_adapter.*`` keys
    <folder>/image_encoder/           a CLIPVisionModelWithProjection and its image processor

The weights are shaped the way diffusers' own UNet tests build them
(``create_ip_adapter_state_dict``): one ``to_k_ip`` / ``to_v_ip`` pair per cross-attention
processor, numbered 1, 3, 5, ... as in the original checkpoints, and a plain ``ImageProjection``
(``proj`` + ``norm``) from the encoder's image embedding to four extra context tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

ADAPTER_FILE = "ip-adapter.safetensors"
IMAGE_SIZE = 32  # the encoder's input side; its processor resizes references to it
# Big enough that the adapter and encoder add over 1 MB to the pipeline's footprint, which
# /health reports in whole MB (rounded up): the difference always shows.
ENCODER = {"hidden_size": 64, "intermediate_size": 512, "num_hidden_layers": 4,
           "num_attention_heads": 4, "patch_size": 4, "projection_dim": 32}
TOKENS = 4  # extra context tokens per reference (diffusers' ImageProjection for IP-Adapter)


def _cross_attention_sizes(unet_config: dict) -> list[int]:
    """The hidden size of each cross-attention processor, in ``attn_processors`` order."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):  # only the processor names are wanted, not weights
        unet = UNet2DConditionModel.from_config(unet_config)
    channels = list(unet.config.block_out_channels)
    sizes = []
    for name in unet.attn_processors:
        if name.endswith("attn1.processor"):
            continue  # self-attention: IP-Adapter adds nothing there
        if name.startswith("mid_block"):
            sizes.append(channels[-1])
        elif name.startswith("up_blocks"):
            sizes.append(list(reversed(channels))[int(name.split(".")[1])])
        else:
            sizes.append(channels[int(name.split(".")[1])])
    return sizes


def adapter_state_dict(unet_config: dict, image_embed_dim: int, seed: int = 0) -> dict:
    """Random IP-Adapter weights for a UNet with ``unet_config``, flattened as the
    ``.safetensors`` checkpoints are (``image_proj.proj.weight``, ``ip_adapter.1.to_k_ip...``)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    cross = unet_config["cross_attention_dim"]

    def weight(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) / shape[-1] ** 0.5

    state = {"image_proj.proj.weight": weight(TOKENS * cross, image_embed_dim),
             "image_proj.proj.bias": torch.zeros(TOKENS * cross),
             "image_proj.norm.weight": torch.ones(cross),
             "image_proj.norm.bias": torch.zeros(cross)}
    for index, hidden in enumerate(_cross_attention_sizes(unet_config)):
        key_id = 2 * index + 1  # odd ids: the original checkpoints number every processor
        state[f"ip_adapter.{key_id}.to_k_ip.weight"] = weight(hidden, cross)
        state[f"ip_adapter.{key_id}.to_v_ip.weight"] = weight(hidden, cross)
    return state


def build_tiny_ip_adapter(folder: Path, pipeline: Path | None = None) -> Path:
    """Write a random-weight IP-Adapter for the tiny SD pipeline into ``folder`` and return
    the weights file. ``pipeline`` is a saved pipeline whose UNet config to fit (default:
    the shape ``build_tiny_sd_pipeline`` builds)."""
    import torch
    from safetensors.torch import save_file
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    unet_config = _unet_config(pipeline)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
        image_size=IMAGE_SIZE, num_channels=3, layer_norm_eps=1e-05, **ENCODER))
    encoder.save_pretrained(folder / "image_encoder", safe_serialization=True)
    CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                       crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                       ).save_pretrained(folder / "image_encoder")
    weights = folder / ADAPTER_FILE
    state = adapter_state_dict(unet_config, ENCODER["projection_dim"])
    save_file({k: v.contiguous() for k, v in state.items()}, str(weights))
    return weights


def _unet_config(pipeline: Path | None) -> dict:
    if pipeline is not None:
        import json

        return json.loads((pipeline / "unet" / "config.json").read_text())
    # what tests.diffusion_fixtures.build_tiny_sd_pipeline(width=32) builds
    return {"block_out_channels": (32, 64), "layers_per_block": 1, "sample_size": 8,
            "in_channels": 4, "out_channels": 4,
            "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"),
            "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"), "cross_attention_dim": 32,
            "attention_head_dim": 8, "norm_num_groups": 32}


def shared_tiny_ip_adapter(tmp_path_factory) -> Path:
    """The tiny adapter's weights file, built once per run however many test processes ask
    (under a lock in the directory xdist's processes share, as ``shared_tiny_sd``)."""
    from filelock import FileLock

    from workers.process import collector_paused

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "shared-tiny-ip-adapter"
    with FileLock(str(root / "shared-tiny-ip-adapter.lock")):
        if not (path / ADAPTER_FILE).exists():
            with collector_paused():
                build_tiny_ip_adapter(root / "shared-tiny-ip-adapter.partial")
            (root / "shared-tiny-ip-adapter.partial").rename(path)
    return path / ADAPTER_FILE
