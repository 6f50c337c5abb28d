"""Videos: ``POST /video`` on a video pipeline (Wan, LTX, CogVideoX, HunyuanVideo, ...).

A video is admitted, queued on the weights lock, tracked in ``GET /progress`` and cancelled
by ``POST /cancel`` through the ``Generator``, exactly as an image is. What differs: the
pipeline decodes its own frames (each family unpacks and scales its latents its own way), a
cancel raises out of the step callback so a stopped video is never decoded, and the frames
are encoded to an MP4 in memory (``media.mp4``). What the pipeline cannot make is refused
before admission: an image pipeline, a size off its grid, an input image it takes none of
(or lacks). Frame counts are rounded up to what the VAE's temporal compression makes whole.
A LoRA adapter the request names is on for its pipeline call only, as for an image.
"""

from __future__ import annotations

import base64
import gc
import logging
import math
import os
import time
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from ..pipeline_kinds import (
    PipelineKind,
    frames_for,
    is_video_pipeline,
    off_multiple,
    pipeline_kind,
    takes_image,
)
from ..tickets import Ticket
from .errors import CudaOutOfMemory, InvalidRequest, UnsupportedEndpoint
from .generation import Generator
from .loader import LoadedPipeline
from .loras import applied, require_adapter
from .media import encode_mp4, video_codec
from .media.pictures import decode_picture
from .memory import Offload
from .schemas import AdapterName, Prompt, RequestId, Side

__all__ = ["VideoGenerator", "VideoPlan", "VideoRequest", "is_video_pipeline",
           "pipeline_kind", "plan_video", "require_kind", "size_multiple", "takes_image",
           "temporal_ratio"]

log = logging.getLogger(__name__)
# where diffusers' video pipelines keep their VAE's compression, by family
TEMPORAL_ATTRS = ("vae_scale_factor_temporal", "vae_temporal_compression_ratio",
                  "vae_temporal_scale_factor")
SPATIAL_ATTRS = ("vae_scale_factor_spatial", "vae_spatial_compression_ratio",
                 "vae_spatial_scale_factor", "vae_scale_factor")
# families whose check_inputs asks a fixed multiple, whatever their VAE compresses
SIZE_FLOORS = {"LTX": 32}
InputImage = Annotated[str, Field(min_length=1, max_length=20_000_000)]  # ~15 MB of PNG


class VideoRequest(BaseModel):
    """The body of ``POST /video``."""

    model_config = ConfigDict(extra="forbid")

    prompt: Prompt
    negative_prompt: str | None = None
    width: Side = Field(default=832, ge=16, le=4096)  # Wan's 480p, landscape
    height: Side = Field(default=480, ge=16, le=4096)
    frames: int = Field(default=33, ge=1, le=1024)  # rounded up to the pipeline's rule
    fps: int = Field(default=16, ge=1, le=60)
    steps: int = Field(default=30, ge=1, le=200)
    guidance: float = Field(default=5.0, ge=0, le=50)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    image: InputImage | None = None  # image-to-video: the picture to start from, base64
    request_id: RequestId | None = None  # names this video for POST /cancel
    adapter: AdapterName | None = None  # a LoRA the worker loaded (--lora), for this video
    adapter_scale: float = Field(default=1.0, ge=0, le=2)


class VideoPlan(NamedTuple):
    """What one request becomes on the loaded pipeline."""

    frames: int  # the asked count rounded up to the pipeline's rule
    image: Any | None  # the decoded input image (PIL), for image-to-video


def require_kind(loaded: LoadedPipeline | None, kind: PipelineKind) -> None:
    """Refuse (400 ``unsupported_endpoint``) a route that does not serve the loaded pipeline's
    kind. Nothing loaded yet: admission answers for the pipeline's state instead."""
    if loaded is None or loaded.kind is kind:
        return
    route = "/video" if loaded.kind is PipelineKind.VIDEO else "/generate"
    raise UnsupportedEndpoint(f"this model's pipeline ({type(loaded.pipe).__name__}) makes "
                              f"{loaded.kind}s, not {kind}s: use POST {route}")


def temporal_ratio(pipe: Any) -> int:
    """How many frames the pipeline's VAE folds into one latent frame (1: none)."""
    return _first_int(pipe, TEMPORAL_ATTRS, 1)


def size_multiple(pipe: Any) -> int:
    """Width and height must be multiples of this: the VAE's spatial compression times the
    transformer's spatial patch (Wan 8 × 2, LTX 32 × 1; a UNet has no patch), and of what the
    family checks for itself (``SIZE_FLOORS``)."""
    patch = getattr(pipe, "transformer_spatial_patch_size", None)  # LTX
    if patch is None:
        config = getattr(getattr(pipe, "transformer", None), "config", None)
        patch = getattr(config, "patch_size", None)
    if isinstance(patch, list | tuple):  # (frames, height, width)
        patch = patch[-1]
    grid = _first_int(pipe, SPATIAL_ATTRS, 8) * (patch if isinstance(patch, int) else 1)
    name = type(pipe).__name__
    return math.lcm(grid, *(m for prefix, m in SIZE_FLOORS.items() if name.startswith(prefix)))


def plan_video(loaded: LoadedPipeline, req: VideoRequest) -> VideoPlan:
    """Check ``req`` against the loaded pipeline (400s naming the field) and say what it
    becomes there."""
    require_kind(loaded, PipelineKind.VIDEO)
    require_adapter(loaded.loras, req.adapter)
    name = type(loaded.pipe).__name__
    multiple = size_multiple(loaded.pipe)
    if (param := off_multiple(req.width, req.height, multiple)) is not None:
        raise InvalidRequest(f"{param}: {name} makes videos in multiples of {multiple} pixels "
                             f"(asked {req.width}x{req.height})", param=param)
    if req.image is None and takes_image(name):
        raise InvalidRequest(f"image: {name} turns an image into a video; send the picture "
                             "to start from (base64 PNG)", param="image")
    if req.image is not None and not takes_image(name) and "image" not in loaded.call_params:
        raise InvalidRequest(f"image: {name} makes videos from text; it takes no input image",
                             param="image")
    image = decode_picture(req.image, "image") if req.image is not None else None
    return VideoPlan(frames_for(req.frames, temporal_ratio(loaded.pipe)), image)


class VideoGenerator:
    """Makes videos through a ``Generator``: its admission, weights lock, progress and
    cancellation serve videos unchanged, so images and videos queue on one lock."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator

    async def generate(self, req: VideoRequest) -> dict[str, Any]:
        """Refuse at once what the pipeline cannot make, then admit and run in a thread."""
        loaded = self.generator.holder.loaded  # set once, before the pipeline is READY
        plan = plan_video(loaded, req) if loaded is not None else None
        return await self.generator.admitted(
            req.request_id, lambda ticket, queued: self._run_locked(ticket, req, plan, queued))

    def _run_locked(self, ticket: Ticket, req: VideoRequest, plan: VideoPlan | None,
                    queued: float) -> dict[str, Any]:
        import torch

        loaded = self.generator.holder.loaded
        assert loaded is not None
        plan = plan or plan_video(loaded, req)  # admitted while it was still loading
        started = time.monotonic()
        seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "big")
        last_step = [started]
        step_ends: list[float] = []  # when each denoising step ended
        with self.generator.tracking(ticket, req.steps, step_ends) as count_step:
            def on_step(pipe: Any, step: int, timestep: Any, kwargs: dict) -> dict:
                kwargs = count_step(pipe, step, timestep, kwargs)
                last_step[0] = time.monotonic()
                ticket.raise_if_cancelled()  # out of the loop: a stopped video is not decoded
                return kwargs

            try:
                ticket.raise_if_cancelled()  # a cancel that came before the loop
                with applied(loaded.pipe, req.adapter, req.adapter_scale):
                    output = loaded.pipe(**_call_kwargs(loaded.call_params, req, plan, seed,
                                                        on_step))
            except torch.cuda.OutOfMemoryError as exc:
                gc.collect()
                torch.cuda.empty_cache()
                raise CudaOutOfMemory(f"CUDA out of memory: {exc}"[:500]) from exc
            finally:
                if loaded.hooks is Offload.MODEL:  # a raise mid-loop left a model onloaded
                    loaded.pipe.maybe_free_model_hooks()
            decoded = time.monotonic()
            clip = _frames_uint8(output)
            ticket.raise_if_cancelled()
            mp4 = encode_mp4(clip, req.fps)
            finished = time.monotonic()
            ticket.raise_if_cancelled()  # a cancelled video never answers 200
        count, height, width = clip.shape[:3]
        return {
            "video": base64.b64encode(mp4).decode(), "content_type": "video/mp4",
            "codec": video_codec(), "frames": count, "fps": req.fps, "width": width,
            "height": height, "seed": seed, "device": loaded.device,
            "request_id": ticket.request_id,
            "timings": {"queue_s": round(started - queued, 4),
                        "denoise_s": round(last_step[0] - started, 4),
                        "decode_s": round(decoded - last_step[0], 4),
                        "encode_s": round(finished - decoded, 4),
                        "total_s": round(finished - queued, 4),
                        # as a picture's: the steps run, each one's end from the start
                        "steps": len(step_ends),
                        "step_end_s": [round(end - started, 4) for end in step_ends]},
        }


def _call_kwargs(call_params: frozenset[str], req: VideoRequest, plan: VideoPlan, seed: int,
                 on_step: Any) -> dict[str, Any]:
    import torch

    wanted = {"prompt": req.prompt, "negative_prompt": req.negative_prompt,
              "width": req.width, "height": req.height, "num_frames": plan.frames,
              "num_inference_steps": req.steps, "guidance_scale": req.guidance,
              "generator": torch.Generator(device="cpu").manual_seed(seed),
              "image": plan.image, "output_type": "np", "callback_on_step_end": on_step,
              # the frame rate, where a family conditions on it (LTX, SVD, I2VGen-XL)
              "frame_rate": req.fps, "fps": req.fps, "target_fps": req.fps}
    return {k: v for k, v in wanted.items() if k in call_params and v is not None}


def _frames_uint8(output: Any) -> Any:
    """The first video of a pipeline's output as uint8 frames × height × width × RGB, from
    floats in [0, 1] (``output_type="np"``) or PIL images (pipelines that ignore it)."""
    import numpy as np

    video = output.frames[0]
    if isinstance(video, list):
        return np.stack([np.asarray(frame.convert("RGB")) for frame in video])
    video = np.asarray(video.float().cpu() if hasattr(video, "cpu") else video)
    if video.dtype != np.uint8:
        video = (video.clip(0, 1) * 255).round().astype(np.uint8)
    return video


def _first_int(pipe: Any, names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = getattr(pipe, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default
