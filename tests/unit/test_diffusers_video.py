"""Video in the diffusers worker without a model: pipeline kinds by class name (a table),
frame rounding, the size grid read off a pipeline, the checks before admission, the request
body, and the MP4 encoding."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from pydantic import ValidationError

from tests.lazy_modules import lazy
from workers.diffusers.errors import InvalidRequest, UnsupportedEndpoint
from workers.diffusers.loader import LoadedPipeline
from workers.diffusers.video import (
    VideoRequest,
    plan_video,
    require_kind,
    size_multiple,
    temporal_ratio,
)
from workers.pipeline_kinds import (
    PipelineKind,
    frames_for,
    is_video_pipeline,
    off_multiple,
    pipeline_kind,
    takes_image,
)

av = lazy("av")
np = lazy("numpy")
Image = lazy("PIL.Image")


@pytest.mark.parametrize("name, video, image", [
    ("WanPipeline", True, False),
    ("WanImageToVideoPipeline", True, True),
    ("WanVACEPipeline", True, False),
    ("LTXPipeline", True, False),
    ("LTXImageToVideoPipeline", True, True),
    ("LTXConditionPipeline", True, False),
    ("CogVideoXPipeline", True, False),
    ("CogVideoXImageToVideoPipeline", True, True),
    ("CogVideoXVideoToVideoPipeline", True, False),
    ("HunyuanVideoPipeline", True, False),
    ("HunyuanVideoImageToVideoPipeline", True, True),
    ("HunyuanSkyreelsImageToVideoPipeline", True, True),
    ("MochiPipeline", True, False),
    ("AllegroPipeline", True, False),
    ("LattePipeline", True, False),
    ("TextToVideoSDPipeline", True, False),
    ("VideoToVideoSDPipeline", True, False),
    ("AnimateDiffPipeline", True, False),
    ("AnimateDiffSDXLPipeline", True, False),
    ("I2VGenXLPipeline", True, True),
    ("StableVideoDiffusionPipeline", True, True),
    ("SkyReelsV2Pipeline", True, False),
    ("SkyReelsV2ImageToVideoPipeline", True, True),
    ("Kandinsky5T2VPipeline", True, False),
    ("Kandinsky5I2VPipeline", True, True),
    ("Kandinsky6TI2VAPipeline", True, False),  # text or image: an image is optional
    ("MotifVideoImage2VideoPipeline", True, True),
    ("PIAPipeline", True, True),
    ("CosmosTextToWorldPipeline", True, False),
    ("SomeNewVideoPipeline", True, False),  # any name that says "Video"
    ("StableDiffusionPipeline", False, False),
    ("StableDiffusionXLPipeline", False, False),
    ("StableDiffusionImg2ImgPipeline", False, False),
    ("FluxPipeline", False, False),
    ("StableDiffusion3Pipeline", False, False),
    ("HunyuanDiTPipeline", False, False),
    ("PixArtSigmaPipeline", False, False),
    ("Cosmos2TextToImagePipeline", False, False),
    ("SanaPipeline", False, False),
])
def test_kind_by_class_name(name, video, image):
    assert is_video_pipeline(name) is video
    assert takes_image(name) is image
    assert pipeline_kind(name) is (PipelineKind.VIDEO if video else PipelineKind.IMAGE)


@pytest.mark.parametrize("asked, ratio, frames", [
    (1, 4, 1), (2, 4, 5), (5, 4, 5), (6, 4, 9), (9, 4, 9), (10, 4, 13), (81, 4, 81),
    (64, 4, 65),  # 4 s at 16 fps: one frame more, never fewer
    (1, 8, 1), (9, 8, 9), (10, 8, 17), (121, 8, 121), (120, 8, 121),  # LTX: 8k+1
    (7, 6, 7), (8, 6, 13),  # Mochi: 6k+1
    (1, 1, 1), (16, 1, 16), (17, 1, 17), (16, 0, 16),  # no temporal compression
])
def test_frames_round_up_to_the_vae_rule(asked, ratio, frames):
    assert frames_for(asked, ratio) == frames
    assert frames >= asked


@pytest.mark.parametrize("width, height, multiple, off", [
    (832, 480, 16, None), (32, 32, 16, None), (40, 32, 16, "width"), (32, 40, 16, "height"),
    (40, 40, 16, "width"), (704, 480, 32, None), (720, 480, 32, "width"), (40, 48, 8, None),
])
def test_size_off_the_grid(width, height, multiple, off):
    assert off_multiple(width, height, multiple) == off


class _Config:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _pipe(class_name: str, **attrs: Any) -> Any:
    """A stand-in pipeline: only its class name and the attributes the rules read."""
    return type(class_name, (), attrs)()


def _loaded(pipe: Any, call_params: tuple[str, ...] = ("prompt", "num_frames")) -> Any:
    return LoadedPipeline(pipe=pipe, device="cpu", dtype="float32", hooks=None, footprint_mb=1,
                          load_s=0.0, ready_s=0.0, call_params=frozenset(call_params))


WAN = dict(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8,
           transformer=type("T", (), {"config": _Config(patch_size=[1, 2, 2])})())


@pytest.mark.parametrize("pipe, temporal, multiple", [
    (_pipe("WanPipeline", **WAN), 4, 16),
    (_pipe("LTXPipeline", vae_temporal_compression_ratio=8, vae_spatial_compression_ratio=32,
           transformer_spatial_patch_size=1), 8, 32),
    # LTX checks for multiples of 32 whatever its VAE: a tiny one compresses 4x
    (_pipe("LTXImageToVideoPipeline", vae_temporal_compression_ratio=4,
           vae_spatial_compression_ratio=4, transformer_spatial_patch_size=1), 4, 32),
    (_pipe("MochiPipeline", vae_temporal_scale_factor=6, vae_spatial_scale_factor=8,
           transformer=type("T", (), {"config": _Config(patch_size=2)})()), 6, 16),
    (_pipe("AnimateDiffPipeline", vae_scale_factor=8), 1, 8),  # a UNet: no patch, no time
    (_pipe("SomeVideoPipeline"), 1, 8),  # nothing to read: the defaults
])
def test_rules_read_off_the_pipeline(pipe, temporal, multiple):
    assert temporal_ratio(pipe) == temporal
    assert size_multiple(pipe) == multiple


def _png_b64(size: tuple[int, int] = (24, 16)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, "red").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_plan_rounds_frames_and_decodes_the_input_image():
    wan = _loaded(_pipe("WanPipeline", **WAN))
    plan = plan_video(wan, VideoRequest(prompt="x", width=32, height=48, frames=10))
    assert plan.frames == 13 and plan.image is None
    i2v = _loaded(_pipe("WanImageToVideoPipeline", **WAN), ("prompt", "image"))
    plan = plan_video(i2v, VideoRequest(prompt="x", width=32, height=32, frames=9,
                                        image="data:image/png;base64," + _png_b64()))
    assert plan.frames == 9 and plan.image.size == (24, 16) and plan.image.mode == "RGB"


@pytest.mark.parametrize("name, call, body, param, words", [
    ("WanPipeline", (), {"width": 40}, "width", "multiples of 16"),
    ("WanPipeline", (), {"height": 24}, "height", "multiples of 16"),
    ("WanPipeline", (), {"image": "PNG"}, "image", "takes no input image"),
    ("WanImageToVideoPipeline", ("image",), {}, "image", "turns an image into a video"),
    ("WanImageToVideoPipeline", ("image",), {"image": "bm90IGEgcGljdHVyZQ=="}, "image",
     "not a picture"),
    ("WanImageToVideoPipeline", ("image",), {"image": "%%%"}, "image", "not a picture"),
])
def test_plan_refuses_what_the_pipeline_cannot_make(name, call, body, param, words):
    loaded = _loaded(_pipe(name, **WAN), ("prompt", *call))
    with pytest.raises(InvalidRequest) as refused:
        plan_video(loaded, VideoRequest(**{"prompt": "x", "width": 32, "height": 32, **body}))
    assert refused.value.status == 400 and refused.value.param == param
    assert words in str(refused.value)


def test_each_route_refuses_the_other_kind():
    video, image = _loaded(_pipe("WanPipeline", **WAN)), _loaded(_pipe("StableDiffusionPipeline"))
    require_kind(video, PipelineKind.VIDEO)
    require_kind(image, PipelineKind.IMAGE)
    require_kind(None, PipelineKind.VIDEO)  # still loading: admission answers for the state
    with pytest.raises(UnsupportedEndpoint, match="POST /video") as refused:
        require_kind(video, PipelineKind.IMAGE)
    assert refused.value.body()["error"] == {
        "message": "this model's pipeline (WanPipeline) makes videos, not images: use POST "
                   "/video", "type": "invalid_request_error", "param": None,
        "code": "unsupported_endpoint"}
    with pytest.raises(UnsupportedEndpoint, match="POST /generate"):
        plan_video(image, VideoRequest(prompt="x", width=32, height=32))


@pytest.mark.parametrize("body, field", [
    ({"prompt": ""}, "prompt"), ({"prompt": "  "}, "prompt"), ({"width": 36}, "width"),
    ({"height": 8}, "height"), ({"frames": 0}, "frames"), ({"frames": 5000}, "frames"),
    ({"fps": 0}, "fps"), ({"fps": 61}, "fps"), ({"steps": 0}, "steps"), ({"seed": -1}, "seed"),
    ({"guidance": 51}, "guidance"), ({"image": ""}, "image"), ({"n": 2}, "n"),
    ({"request_id": "a b"}, "request_id"),
])
def test_request_body_is_checked(body, field):
    with pytest.raises(ValidationError) as invalid:
        VideoRequest(**{"prompt": "x", **body})
    assert invalid.value.errors()[0]["loc"][0] == field


def test_request_defaults():
    req = VideoRequest(prompt="x")
    assert (req.width, req.height, req.frames, req.fps) == (832, 480, 33, 16)
    assert req.image is None and req.seed is None


def test_mp4_holds_every_frame_at_the_rate():
    from workers.diffusers.media.mp4 import encode_mp4, video_codec

    frames = np.random.default_rng(0).integers(0, 255, (9, 32, 48, 3), dtype=np.uint8)
    data = encode_mp4(frames, 12)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        decoded = list(container.decode(video=0))
        assert stream.average_rate == 12 and stream.codec_context.pix_fmt == "yuv420p"
    assert len(decoded) == 9 and (decoded[0].width, decoded[0].height) == (48, 32)
    assert video_codec() in ("libx264", "mpeg4")


def test_mp4_is_the_same_file_for_the_same_frames_whatever_the_heap_held():
    """A seed gives the same video: the encoder reads no memory it did not write. Grey noise
    at 32x32 came out as other bytes each time the process heap held other garbage while
    x264's macroblock tree was on (a tiny Wan video on a busy worker did)."""
    import ctypes

    from workers.diffusers.media.mp4 import encode_mp4

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    frames = np.random.default_rng(3).normal(120, 10, (9, 32, 32, 3)).clip(0, 255)
    frames = frames.astype(np.uint8)
    files = set()
    for garbage in range(6):  # blocks filled with other bytes, then freed for reuse
        blocks = [libc.malloc(4096 * (n + 1)) for n in range(64)]
        for n, block in enumerate(blocks):
            ctypes.memset(block, (garbage * 37 + n) & 255, 4096 * (n + 1))
        for block in blocks:
            libc.free(ctypes.c_void_p(block))
        files.add(encode_mp4(frames, 16))
    assert len(files) == 1
