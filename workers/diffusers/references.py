"""Identity and style references: an IP-Adapter attached at load, and a request's reference
images turned into the pipeline's ``ip_adapter_image``.

Loading (``--ip-adapter PATH``): the adapter's weights file, or a folder holding exactly one
``*.safetensors`` / ``*.bin`` file; its CLIP image encoder is the ``image_encoder/`` folder
beside it unless ``--ip-adapter-image-encoder`` names another. Both are attached right after
``from_pretrained``, before the weights are placed, so the encoder and the adapter's
attention layers move with the pipeline between VRAM and CPU RAM and count in its footprint.

Generating: with references the adapter's scale is the request's ``reference_strength``.
Without any, a UNet that carries an adapter still wants an image embedding at every step, so
it gets the neutral one diffusers itself uses for the unconditional half (zeros) at scale 0;
diffusers then skips the adapter's attention altogether and the images are those of the
model without the adapter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import InvalidRequest
from .media.pictures import decode_picture
from .schemas import GenerateRequest

log = logging.getLogger(__name__)

ADAPTER_SUFFIXES = (".safetensors", ".bin")
MANIFEST_FIELD = "ip_adapter"  # where a model's manifest names its adapter (the coordinator's)


class Referenced(Protocol):
    """What a request's references need of the loaded pipeline (``loader.LoadedPipeline``;
    a protocol so this module and the loader do not import each other)."""

    pipe: Any
    ip_adapter: str | None


# -- loading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdapterFiles:
    """Where one IP-Adapter's pieces are on disk."""

    folder: Path
    weight_name: str
    image_encoder: Path | None  # None: use the image encoder the pipeline ships with

    @property
    def weights(self) -> Path:
        return self.folder / self.weight_name


def adapter_files(path: str, image_encoder: str | None = None) -> AdapterFiles:
    """Resolve ``--ip-adapter`` (and ``--ip-adapter-image-encoder``) to files; ``OSError``
    naming the flag when they are not there."""
    given = Path(path)
    if given.is_file():
        folder, weight_name = given.parent, given.name
    elif given.is_dir():
        found = sorted(p.name for p in given.iterdir()
                       if p.is_file() and p.suffix in ADAPTER_SUFFIXES)
        if len(found) != 1:
            raise OSError(f"--ip-adapter {path}: expected one *.safetensors or *.bin adapter "
                          f"file in the folder, found {found or 'none'}; name the file")
        folder, weight_name = given, found[0]
    else:
        raise OSError(f"--ip-adapter {path}: no such file or folder")
    if image_encoder is not None:
        encoder: Path | None = Path(image_encoder)
        if not encoder.is_dir():
            raise OSError(f"--ip-adapter-image-encoder {image_encoder}: not a folder")
    else:
        encoder = folder / "image_encoder"
        encoder = encoder if encoder.is_dir() else None
    return AdapterFiles(folder, weight_name, encoder)


def attach_ip_adapter(pipe: Any, files: AdapterFiles) -> str:
    """Load the image encoder and its image processor from local files, set them on ``pipe``,
    then the adapter's layers into its UNet (``load_ip_adapter``, local files only). Returns
    the adapter's weights path, which ``/health`` reports."""
    from diffusers.loaders import IPAdapterMixin

    if not isinstance(pipe, IPAdapterMixin):
        raise OSError(f"--ip-adapter: {type(pipe).__name__} does not take a UNet IP-Adapter "
                      "(Stable Diffusion 1.x / 2.x / XL pipelines do)")
    if files.image_encoder is not None:
        encoder, processor = _image_encoder(files.image_encoder, pipe.dtype)
        pipe.register_modules(image_encoder=encoder.to(pipe.device), feature_extractor=processor)
    elif getattr(pipe, "image_encoder", None) is None:
        raise OSError(f"--ip-adapter {files.weights}: no image_encoder folder beside it and "
                      "none in the pipeline; name one with --ip-adapter-image-encoder")
    # the encoder is registered already, so diffusers looks for no other one
    pipe.load_ip_adapter(str(files.folder), subfolder="", weight_name=files.weight_name,
                         image_encoder_folder=None, local_files_only=True)
    pipe.set_ip_adapter_scale(0.0)  # until a request brings references
    log.info("IP-Adapter %s attached (image encoder %s)", files.weights,
             files.image_encoder or "from the pipeline")
    return str(files.weights)


def _image_encoder(folder: Path, dtype: Any) -> tuple[Any, Any]:
    """A ``CLIPVisionModelWithProjection`` and a ``CLIPImageProcessor`` that fits it: the
    folder's own ``preprocessor_config.json``, else one sized to the encoder (as diffusers
    builds one when a pipeline has none)."""
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    encoder = CLIPVisionModelWithProjection.from_pretrained(folder, local_files_only=True,
                                                            dtype=dtype)
    if (folder / "preprocessor_config.json").is_file():
        return encoder, CLIPImageProcessor.from_pretrained(folder, local_files_only=True)
    size = encoder.config.image_size
    return encoder, CLIPImageProcessor(size=size, crop_size=size)


# -- a request's references -------------------------------------------------------------------


def reference_kwargs(loaded: Referenced, req: GenerateRequest) -> dict[str, Any]:
    """The pipeline arguments for ``req``'s references: ``ip_adapter_image`` at the request's
    strength, the neutral embedding at scale 0 when an adapter is attached and the request
    has none, nothing on a pipeline without one. Sets the adapter's scale (callers hold the
    weights lock, so no other generation sees it). ``InvalidRequest`` for references the
    pipeline cannot take or that are not images."""
    if not req.reference_images:
        if loaded.ip_adapter is None:
            return {}
        loaded.pipe.set_ip_adapter_scale(0.0)
        return {"ip_adapter_image_embeds": neutral_embeds(loaded.pipe, req.guidance)}
    if loaded.ip_adapter is None:
        raise InvalidRequest(
            "reference_images: this model has no IP-Adapter, so it cannot take reference "
            f"images; give the model one in its manifest's '{MANIFEST_FIELD}' field",
            param="reference_images")
    images = [decode_picture(data, f"reference_images.{index}")
              for index, data in enumerate(req.reference_images)]
    loaded.pipe.set_ip_adapter_scale(req.reference_strength)
    return {"ip_adapter_image": [images]}  # one adapter: one list of its images


def neutral_embeds(pipe: Any, guidance: float) -> list[Any]:
    """Zeros shaped as one reference's embedding for each attached adapter (diffusers' own
    unconditional image embedding), doubled for classifier-free guidance as the pipeline's
    ``prepare_ip_adapter_image_embeds`` expects of precomputed embeddings."""
    import torch
    from diffusers.models.embeddings import ImageProjection

    unet = pipe.unet
    guided = guidance > 1 and getattr(unet.config, "time_cond_proj_dim", None) is None
    batch = 2 if guided else 1
    embeds = []
    for layer in unet.encoder_hid_proj.image_projection_layers:
        if isinstance(layer, ImageProjection):  # fed the encoder's pooled image_embeds
            shape: tuple[int, ...] = (batch, 1, layer.image_embeds.in_features)
        else:  # fed the encoder's penultimate hidden states
            config = pipe.image_encoder.config
            tokens = (config.image_size // config.patch_size) ** 2 + 1
            shape = (batch, 1, tokens, config.hidden_size)
        embeds.append(torch.zeros(shape, dtype=unet.dtype))
    return embeds
