"""LoRA adapters on the diffusers worker: real worker processes serving the tiny random-weight
StableDiffusionPipeline, one with two tiny real LoRAs loaded (``--lora NAME=PATH``: one named
by its file, one by its folder) and one with none, so each answer can be held against what the
bare model gives for the same seed; and the tiny Wan text-to-video pipeline with one."""

from __future__ import annotations

import base64
import io
import threading

import httpx
import numpy as np
import pytest

from tests.conftest import wait_for
from tests.e2e.test_diffusers_worker import WorkerProcess, _denoising, _png
from tests.e2e.test_video_worker import SMALL, _decoded
from tests.lazy_modules import lazy
from tests.lora_diffusion_fixtures import LORA_FILE, shared_tiny_sd_lora, shared_tiny_wan_lora
from tests.video_fixtures import shared_tiny_video

Image = lazy("PIL.Image")

pytestmark = pytest.mark.slow

BODY = {"prompt": "a portrait", "width": 64, "height": 64, "steps": 3, "seed": 11}
# the second adapter is big enough (over 1 MB of layers) that the footprint shows it in whole MB
WIDE_RANK = 128


@pytest.fixture(scope="session")
def sketch(tmp_path_factory):
    """The first LoRA's weights file (rank 4)."""
    return shared_tiny_sd_lora(tmp_path_factory, "sketch", seed=1)


@pytest.fixture(scope="session")
def neon(tmp_path_factory):
    """The second LoRA's weights file (another seed, rank ``WIDE_RANK``)."""
    return shared_tiny_sd_lora(tmp_path_factory, "neon", seed=2, rank=WIDE_RANK)


@pytest.fixture(scope="module")
def workers(tiny_sd, sketch, neon, tmp_path_factory):
    """(with both LoRAs, without any), started together and both ready."""
    logs = tmp_path_factory.mktemp("lora-logs")
    started = [WorkerProcess(tiny_sd, logs, "--lora", f"sketch={sketch}",
                             "--lora", f"neon={neon.parent}"),
               WorkerProcess(tiny_sd, logs)]
    try:
        for proc in started:
            proc.wait_state("ready", timeout=180)
        yield tuple(started)
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture(scope="module")
def adapted(workers):
    return workers[0]


@pytest.fixture(scope="module")
def plain(workers):
    return workers[1]


@pytest.fixture(scope="module")
def base_images(plain):
    """What the bare model makes of ``BODY``."""
    return _generate(plain)


def _generate(worker: WorkerProcess, **body) -> list[str]:
    answer = worker.post("/generate", json={**BODY, **body})
    assert answer.status_code == 200, answer.text
    images = answer.json()["images"]
    assert all(_png(image).size == (64, 64) for image in images)
    return images


def _pixels(image: str) -> np.ndarray:
    return np.asarray(_png(image).convert("RGB"), dtype=np.float64)


def _apart(first: list[str], second: list[str]) -> float:
    """Mean absolute difference of two answers' first images, in 0..255 levels."""
    return float(np.abs(_pixels(first[0]) - _pixels(second[0])).mean())


def test_health_lists_the_loras_and_counts_them(adapted, plain):
    with_loras, without = adapted.health().json(), plain.health().json()
    assert with_loras["loras"] == ["sketch", "neon"] and without["loras"] == []
    assert with_loras["state"] == "ready" and with_loras["error"] is None
    assert with_loras["footprint_mb"] > without["footprint_mb"]  # the adapters' layers


def test_no_adapter_gives_the_base_models_images(adapted, plain, base_images):
    """Loaded and switched off, the adapters take no part: the same seed gives the same
    images, bit for bit, as a worker without any (guided and unguided)."""
    assert _generate(adapted) == base_images
    assert _generate(adapted, guidance=1.0) == _generate(plain, guidance=1.0)


def test_each_adapter_changes_the_image_its_own_way(adapted, base_images):
    sketched = _generate(adapted, adapter="sketch")
    neoned = _generate(adapted, adapter="neon")
    assert _apart(sketched, base_images) > 1 and _apart(neoned, base_images) > 1
    assert _apart(sketched, neoned) > 1
    assert _generate(adapted, adapter="sketch") == sketched  # seeded: the same again
    assert _generate(adapted, adapter="sketch", adapter_scale=0) == base_images
    half = _generate(adapted, adapter="sketch", adapter_scale=0.5)
    double = _generate(adapted, adapter="sketch", adapter_scale=2)
    assert half not in (base_images, sketched) and double not in (base_images, sketched)
    assert _apart(half, base_images) < _apart(double, base_images)


def test_adapters_in_turn_leave_nothing_behind(adapted, base_images):
    """One process, one request after another: each gets what it got the first time."""
    order = ["sketch", "neon", None, "sketch", None, "neon", "neon", "sketch"]
    seen: dict[str | None, list[str]] = {}
    for name in order:
        images = _generate(adapted, **({"adapter": name} if name else {}))
        assert seen.setdefault(name, images) == images, f"{name} after {list(seen)}"
    assert seen[None] == base_images


def _b64_png(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_edits_take_the_adapter(adapted, plain, base_images):
    """Image-to-image and inpainting run pipelines made from the loaded one (``from_pipe``),
    which share its UNet: the adapter set there is the edit's too, and only for that edit."""
    picture = base_images[0]
    mask = Image.new("L", (64, 64))
    mask.paste(255, (0, 0, 32, 64))  # repaint the left half
    for extra in ({"image": picture, "strength": 0.6, "steps": 6},
                  {"image": picture, "mask": _b64_png(mask), "strength": 0.9, "steps": 6}):
        bare = _generate(plain, **extra)
        assert _generate(adapted, **extra) == bare
        edited = _generate(adapted, adapter="neon", **extra)
        assert _apart(edited, bare) > 1
        assert _generate(adapted, adapter="neon", **extra) == edited
        assert _generate(adapted, adapter="neon", adapter_scale=0, **extra) == bare
    assert _generate(adapted) == base_images  # the edits left nothing on


def test_an_unknown_adapter_is_a_400_naming_the_known_ones(adapted, plain):
    answer = adapted.post("/generate", json={**BODY, "adapter": "watercolour"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "adapter" and error["type"] == "invalid_request_error"
    assert "'watercolour'" in error["message"]
    assert "'sketch'" in error["message"] and "'neon'" in error["message"]
    refused = plain.post("/generate", json={**BODY, "adapter": "sketch"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "adapter"
    assert "--lora NAME=PATH" in refused.json()["error"]["message"]
    assert adapted.post("/generate", json=BODY).status_code == 200  # the worker carries on


@pytest.mark.parametrize("extra, param", [
    ({"adapter_scale": 2.5}, "adapter_scale"),
    ({"adapter_scale": -0.1}, "adapter_scale"),
    ({"adapter": ""}, "adapter"),
])
def test_out_of_range_adapter_fields_are_a_400(adapted, extra, param):
    answer = adapted.post("/generate", json={**BODY, "adapter": "sketch", **extra})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_a_cancelled_generation_leaves_no_adapter_on(adapted, base_images):
    result: dict = {}

    def long_generation() -> None:
        result["answer"] = adapted.post("/generate", json={
            **BODY, "steps": 200, "adapter": "neon", "request_id": "lora-long"})

    thread = threading.Thread(target=long_generation)
    thread.start()
    try:
        wait_for(lambda: _denoising(adapted, "lora-long"), timeout=30,
                 what=lambda: httpx.get(adapted.url + "/progress").json())
        assert adapted.post("/cancel", json={"request_id": "lora-long"}).status_code == 200
    finally:
        thread.join(60)
    assert result["answer"].status_code == 409
    assert result["answer"].json()["error"]["code"] == "cancelled"
    assert _generate(adapted) == base_images


def test_offload_then_onload_keeps_the_adapters(adapted, base_images):
    sketched = _generate(adapted, adapter="sketch")
    assert adapted.post("/offload").json()["tier"] == "cpu"
    assert adapted.post("/onload").json()["tier"] == "gpu"
    assert _generate(adapted, adapter="sketch") == sketched
    assert _generate(adapted) == base_images
    health = adapted.health().json()
    assert health["loras"] == ["sketch", "neon"] and health["loads_from_disk"] == 1


def test_a_broken_lora_fails_the_load_naming_the_file(tiny_sd, sketch, tmp_path):
    path = tmp_path / "broken" / LORA_FILE
    path.parent.mkdir()
    good = sketch.read_bytes()
    path.write_bytes(good[:len(good) // 2])  # the first half: its header promises more
    proc = WorkerProcess(tiny_sd, tmp_path, "--lora", "sketch=" + str(sketch),
                         "--lora", f"broken={path}")
    try:
        health = proc.wait_state("failed", timeout=180)
        assert proc.health().status_code == 503
        assert f"--lora broken={path}" in health["error"], health["error"]
        assert health["loads_from_disk"] == 0 and health["loras"] == []
        refused = proc.post("/generate", json={**BODY, "adapter": "broken"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
    finally:
        proc.stop()


@pytest.mark.parametrize("flag, words", [
    ("sketch", "is not NAME=PATH"),
    ("sketch=", "is not NAME=PATH"),
    ("sk.etch=/x", "letters, digits"),
])
def test_a_malformed_lora_flag_is_a_usage_error(flag, words):
    from workers.diffusers.options import parse_args
    from workers.spare import InvalidOptions, RaisingParser

    with pytest.raises(InvalidOptions, match=words):
        parse_args(["--model", "m", "--port", "1", "--lora", flag], parser_class=RaisingParser)
    with pytest.raises(InvalidOptions, match="given twice"):
        parse_args(["--model", "m", "--port", "1", "--lora", "a=/x", "--lora", "a=/y"],
                   parser_class=RaisingParser)


def test_a_lora_path_with_no_weights_is_named(tmp_path):
    """What ``--lora NAME=PATH`` resolves to, found before any weights are read."""
    from workers.diffusers.loras import lora_file

    (tmp_path / "two").mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        (tmp_path / "two" / name).write_bytes(b"")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "style.safetensors").write_bytes(b"")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / LORA_FILE).write_bytes(b"")
    assert lora_file("x", str(tmp_path / "one")) == tmp_path / "one" / "style.safetensors"
    assert lora_file("x", str(tmp_path / "saved")) == tmp_path / "saved" / LORA_FILE
    for where, words in (("nowhere", "no such file or folder"), ("two", "2 other")):
        with pytest.raises(OSError, match=words) as raised:
            lora_file("x", str(tmp_path / where))
        assert str(raised.value).startswith(f"--lora x={tmp_path / where}: ")


# -- video ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def video_worker(tmp_path_factory):
    """The tiny Wan text-to-video pipeline with one LoRA on its transformer."""
    lora = shared_tiny_wan_lora(tmp_path_factory, "clay", seed=3)
    proc = WorkerProcess(shared_tiny_video(tmp_path_factory),
                         tmp_path_factory.mktemp("video-lora-logs"), "--lora", f"clay={lora}")
    proc.wait_state("ready", timeout=180)
    yield proc
    proc.stop()


def _frames(worker: WorkerProcess, **body) -> np.ndarray:
    answer = worker.post("/video", json={**SMALL, "seed": 5, **body})
    assert answer.status_code == 200, answer.text
    return np.stack([frame.to_ndarray(format="rgb24") for frame in _decoded(answer.json())])


def test_a_video_takes_the_adapter_for_itself_only(video_worker):
    assert video_worker.health().json()["loras"] == ["clay"]
    bare = _frames(video_worker)
    clay = _frames(video_worker, adapter="clay")
    assert not np.array_equal(clay, bare)
    assert np.array_equal(_frames(video_worker, adapter="clay", adapter_scale=0), bare)
    assert np.array_equal(_frames(video_worker), bare)  # nothing left on
    refused = video_worker.post("/video", json={**SMALL, "adapter": "marble"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "adapter"
    assert "'clay'" in refused.json()["error"]["message"]
