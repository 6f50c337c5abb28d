"""Reference images through an IP-Adapter: real worker processes serving the tiny random-weight
StableDiffusionPipeline, one with the tiny adapter attached (``--ip-adapter``) and one without,
so each answer can be held against what the bare model gives for the same seed."""

from __future__ import annotations

import base64
import io

import pytest

from tests.e2e.test_diffusers_worker import WorkerProcess, _png
from tests.lazy_modules import lazy
from tests.reference_fixtures import shared_tiny_ip_adapter

Image = lazy("PIL.Image")

pytestmark = pytest.mark.slow

BODY = {"prompt": "a portrait", "width": 64, "height": 64, "steps": 3, "seed": 11}


@pytest.fixture(scope="session")
def tiny_ip_adapter(tmp_path_factory):
    """The tiny adapter's weights file (``image_encoder/`` beside it)."""
    return shared_tiny_ip_adapter(tmp_path_factory)


@pytest.fixture(scope="module")
def workers(tiny_sd, tiny_ip_adapter, tmp_path_factory):
    """(with the adapter, without it), started together and both ready."""
    logs = tmp_path_factory.mktemp("reference-logs")
    started = [WorkerProcess(tiny_sd, logs, "--ip-adapter", str(tiny_ip_adapter)),
               WorkerProcess(tiny_sd, logs)]
    try:
        for proc in started:
            proc.wait_state("ready", timeout=180)
        yield tuple(started)
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture(scope="module")
def referenced(workers):
    return workers[0]


@pytest.fixture(scope="module")
def plain(workers):
    return workers[1]


def _image_b64(seed: int, fmt: str = "PNG", size: tuple[int, int] = (48, 40)) -> str:
    import random

    rng = random.Random(seed)
    image = Image.new("RGB", size)
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256))
                   for _ in range(size[0] * size[1])])
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def _generate(worker: WorkerProcess, **body) -> list[str]:
    answer = worker.post("/generate", json={**BODY, **body})
    assert answer.status_code == 200, answer.text
    images = answer.json()["images"]
    assert all(_png(image).size == (body.get("width", 64), 64) for image in images)
    return images


def test_health_reports_the_adapter_and_its_weight(referenced, plain, tiny_ip_adapter):
    with_adapter, without = referenced.health().json(), plain.health().json()
    assert with_adapter["ip_adapter"] == str(tiny_ip_adapter)
    assert without["ip_adapter"] is None
    # the image encoder and the adapter's attention layers count (over 1 MB in the fixture)
    assert with_adapter["footprint_mb"] > without["footprint_mb"]


@pytest.mark.parametrize("guidance", [7.0, 1.0], ids=["guided", "unguided"])
def test_no_reference_gives_what_the_model_gives_without_the_adapter(referenced, plain,
                                                                     guidance):
    """At scale 0 with the neutral embedding, the adapter takes no part: same seed, same
    images as the bare model (with and without classifier-free guidance, whose embeddings
    the pipeline splits in two)."""
    assert _generate(referenced, guidance=guidance) == _generate(plain, guidance=guidance)


def test_a_reference_changes_the_image_and_strength_zero_does_not(referenced):
    bare = _generate(referenced)
    reference = _image_b64(1)
    steered = _generate(referenced, reference_images=[reference])
    assert steered != bare
    assert _generate(referenced, reference_images=[reference]) == steered  # seeded
    assert _generate(referenced, reference_images=[reference], reference_strength=0) == bare
    weaker = _generate(referenced, reference_images=[reference], reference_strength=0.2)
    assert weaker not in (bare, steered)
    other = _generate(referenced, reference_images=[_image_b64(2, "JPEG")])
    assert other not in (bare, steered)


def test_several_references_and_several_images(referenced):
    references = [_image_b64(1), _image_b64(3, "WEBP", (20, 70)), _image_b64(4, "JPEG")]
    data_url = "data:image/png;base64," + _image_b64(5)
    images = _generate(referenced, reference_images=[*references, data_url], n=2, width=96)
    assert len(images) == 2


def test_offload_then_onload_then_a_referenced_generation(referenced):
    reference = _image_b64(6)
    before = _generate(referenced, reference_images=[reference])
    offload = referenced.post("/offload")
    assert offload.status_code == 200 and offload.json()["tier"] == "cpu"
    assert referenced.health().json()["state"] == "offloaded"
    onload = referenced.post("/onload")
    assert onload.status_code == 200 and onload.json()["tier"] == "gpu"
    assert _generate(referenced, reference_images=[reference]) == before
    health = referenced.health().json()
    assert health["loads_from_disk"] == 1 and health["ip_adapter"]


def test_references_to_a_model_without_an_adapter_are_a_400(plain):
    answer = plain.post("/generate", json={**BODY, "reference_images": [_image_b64(1)]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "reference_images"
    assert "no IP-Adapter" in error["message"] and "ip_adapter" in error["message"]
    assert plain.post("/generate", json=BODY).status_code == 200  # the worker carries on


def _truncated_png() -> str:
    return base64.b64encode(base64.b64decode(_image_b64(1))[:120]).decode()


@pytest.mark.parametrize("garbage", [
    "not base64 at all!",
    base64.b64encode(b"plain text, no picture").decode(),
    base64.b64encode(b"GIF89a" + bytes(40)).decode(),  # an image, but not a format we take
    "truncated",
], ids=["not-base64", "not-an-image", "gif", "truncated-png"])
def test_a_reference_that_is_no_image_is_a_400_naming_it(referenced, garbage):
    garbage = _truncated_png() if garbage == "truncated" else garbage
    answer = referenced.post("/generate", json={**BODY, "reference_images": [
        _image_b64(1), garbage]})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "reference_images.1"
    assert error["message"].startswith("reference_images.1: ")
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("extra, param", [
    ({"reference_images": ["x"] * 5}, "reference_images"),
    ({"reference_images": [""]}, "reference_images"),
    ({"reference_strength": 1.5}, "reference_strength"),
    ({"reference_strength": -0.1}, "reference_strength"),
])
def test_out_of_range_reference_fields_are_a_400(referenced, extra, param):
    answer = referenced.post("/generate", json={**BODY, **extra})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param
