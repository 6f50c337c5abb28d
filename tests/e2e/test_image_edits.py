"""Pictures in, through a real coordinator and the real diffusers worker: OpenAI's image edits
(``images.edit`` of the official client), inpainting, IP-Adapter references, AUTOMATIC1111's
routes, edits as jobs, and the bad pictures each refused with a 400 before any load.

The tiny random-weight pipeline's VAE encodes as a trained one does (tests/diffusion_fixtures.py),
so what an edit kept of its picture can be measured: against the picture as the model's own
VAE renders it (encoded and decoded, no denoising)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, worker_secret
from tests.lazy_modules import lazy

openai = lazy("openai")
Image = lazy("PIL.Image")
np = lazy("numpy")

pytestmark = pytest.mark.slow

GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}], "max_image_side": 512,
       "max_upload_bytes": 2 * 1024 * 1024}
SIDE = 64


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    from tests.reference_fixtures import shared_tiny_ip_adapter

    return shared_tiny_ip_adapter(tmp_path_factory)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_sd, adapter, demo_gguf):
    from tests.lora_diffusion_fixtures import shared_tiny_sd_lora

    sketch = shared_tiny_sd_lora(tmp_path_factory, "sketch", 0)
    manifests = [{"id": "tiny-sd", "category": "diffusion", "backend": "diffusers",
                  "path": str(tiny_sd), "vram_mb": 3000, "ip_adapter": str(adapter),
                  "adapters": [{"id": "tiny-sd-sketch", "path": str(sketch)},
                               {"id": "tiny-sd-faint", "path": str(sketch), "scale": 0.0}]},
                 {"id": "plain-sd", "category": "diffusion", "backend": "diffusers",
                  "path": str(tiny_sd), "vram_mb": 3000},
                 llama_manifest("smol", demo_gguf, vram_mb=3000)]
    srv = ServerProcess(tmp_path_factory.mktemp("edits"), GPU, manifests)
    srv.start()
    yield srv
    srv.stop()


def picture(seed: int = 0, side: int = SIDE, mode: str = "RGB"):
    """A smooth picture (gradients a VAE keeps), different for each seed."""
    yy, xx = np.mgrid[0:side, 0:side]
    channels = [(xx * 4 + seed * 40) % 256, (yy * 4 + seed * 90) % 256, (xx + yy) * 2 % 256]
    return Image.fromarray(np.stack(channels, -1).astype(np.uint8)).convert(mode)


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def pixels(b64: str):
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB")).astype(float)


def as_the_vae_renders(tiny_sd: Path, image):
    """``image`` encoded and decoded by the pipeline's own VAE: what an edit that denoises
    nothing would give."""
    import torch
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(tiny_sd / "vae")
    with torch.no_grad():
        x = torch.tensor(np.asarray(image)).permute(2, 0, 1)[None].float() / 127.5 - 1
        out = vae.decode(vae.encode(x).latent_dist.mean).sample[0]
    return ((out.permute(1, 2, 0).clamp(-1, 1) + 1) * 127.5).numpy()


def mask_png(transparent: tuple[int, int, int, int], side: int = SIDE) -> bytes:
    """An RGBA mask, opaque but for the ``transparent`` box (what OpenAI's edits repaint)."""
    mask = Image.new("RGBA", (side, side), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), transparent)
    return png(mask)


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def edit(server, **fields):
    return client(server).images.edit(model="tiny-sd", prompt="a red square",
                                      image=("in.png", png(picture()), "image/png"),
                                      **fields)


def test_an_edit_keeps_its_picture_by_its_strength(server, tiny_sd):
    """``images.edit`` with no mask is image-to-image: at strength 0.05 the answer is the
    picture as the model's VAE renders it; at 0.9 the model repaints it; the same seed with
    another picture gives another answer."""
    rendered = as_the_vae_renders(tiny_sd, picture())
    light = edit(server, size="64x64", extra_body={"strength": 0.05, "steps": 20, "seed": 3})
    heavy = edit(server, size="64x64", extra_body={"strength": 0.9, "steps": 20, "seed": 3})
    other = client(server).images.edit(
        model="tiny-sd", prompt="a red square", image=("b.png", png(picture(5)), "image/png"),
        size="64x64", extra_body={"strength": 0.05, "steps": 20, "seed": 3})
    kept, repainted = (np.abs(pixels(r.data[0].b64_json) - rendered).mean()
                       for r in (light, heavy))
    assert kept < 6 < 20 < repainted, (kept, repainted)
    assert np.abs(pixels(other.data[0].b64_json) - pixels(light.data[0].b64_json)).mean() > 10


def test_an_edit_answers_the_asked_size_or_its_pictures(server):
    sized = edit(server, size="96x64", n=2, extra_body={"steps": 2, "seed": 1})
    assert len(sized.data) == 2
    assert all(pixels(item.b64_json).shape == (64, 96, 3) for item in sized.data)
    own = client(server).images.edit(model="tiny-sd", prompt="x", extra_body={"steps": 2},
                                     image=("odd.png", png(picture(side=75)), "image/png"))
    assert pixels(own.data[0].b64_json).shape == (72, 72, 3)  # its own, to a multiple of 8


def test_inpainting_repaints_where_the_mask_is_transparent(server, tiny_sd):
    rendered = as_the_vae_renders(tiny_sd, picture())
    answer = edit(server, size="64x64", mask=("m.png", mask_png((16, 16, 48, 48)), "image/png"),
                  extra_body={"strength": 1.0, "steps": 20, "seed": 3})
    moved = np.abs(pixels(answer.data[0].b64_json) - rendered).mean(axis=2)
    inside, outside = moved[20:44, 20:44].mean(), moved[:12].mean()
    assert inside > 1.4 * outside, (inside, outside)
    whole = edit(server, size="64x64", extra_body={"strength": 1.0, "steps": 20, "seed": 3})
    moved = np.abs(pixels(whole.data[0].b64_json) - rendered).mean(axis=2)
    assert moved[20:44, 20:44].mean() < 1.2 * moved[:12].mean()  # no mask: all of it


def test_a_warm_models_edit_loads_nothing_and_takes_no_new_lease(server):
    edit(server, extra_body={"steps": 2})  # warm
    leases = held(server)
    slot = next(s for s in server.status()["slots"] if s["model"] == "tiny-sd")
    edit(server, mask=("m.png", mask_png((0, 0, 8, 8)), "image/png"), extra_body={"steps": 2})
    after = next(s for s in server.status()["slots"] if s["model"] == "tiny-sd")
    assert held(server) == leases and after["lease"]["id"] in {i for i, _, _ in leases}
    assert (after["pid"], after["state"]) == (slot["pid"], "ready")
    secret = worker_secret(after["pid"])
    health = httpx.get(f"http://127.0.0.1:{after['port']}/health",
                       headers={"Authorization": f"Bearer {secret}"}).json()
    assert health["loads_from_disk"] == 1 and health["ip_adapter"]


def held(server) -> set[tuple[str, str, str]]:
    """The leases held: id, holder, allocations (their expiry moves with each renewal)."""
    leases = httpx.get(server.url + "/api/v1/leases", timeout=10).json()["leases"]
    return {(lease["id"], lease["holder"], str(lease["allocations"])) for lease in leases}


def test_references_steer_a_generation_and_an_edit(server):
    """With the model's IP-Adapter, a reference changes the picture; strength 0 leaves it as
    it would be without one."""
    reference = base64.b64encode(png(picture(7))).decode()
    body = {"model": "tiny-sd", "prompt": "a face", "size": "64x64", "x_steps": 3,
            "x_seed": 9}

    def made(**extra) -> np.ndarray:
        answer = httpx.post(server.url + "/v1/images/generations", json={**body, **extra},
                            timeout=300)
        assert answer.status_code == 200, answer.text
        return pixels(answer.json()["data"][0]["b64_json"])

    plain = made()
    steered = made(reference_images=[reference], reference_strength=1.0)
    unsteered = made(reference_images=[reference], reference_strength=0.0)
    assert np.abs(steered - plain).mean() > 1.0
    assert np.abs(unsteered - plain).mean() < 0.5
    edited = edit(server, size="64x64", extra_body={"steps": 2, "seed": 1,
                                                    "reference_images": [reference]})
    assert pixels(edited.data[0].b64_json).shape == (64, 64, 3)


def test_a_lora_is_a_model_of_its_own_on_the_pipelines_worker(server):
    """``tiny-sd-sketch`` is the tiny pipeline with its LoRA for that request only: another
    picture from the same seed, the base's own picture unchanged after it, an edit through it
    too, and no second worker; at scale 0 it is the base."""
    body = {"prompt": "a cat", "size": "64x64", "x_steps": 3, "x_seed": 11}

    def made(model: str) -> np.ndarray:
        answer = httpx.post(server.url + "/v1/images/generations", json={**body, "model": model},
                            timeout=300)
        assert answer.status_code == 200, answer.text
        return pixels(answer.json()["data"][0]["b64_json"])

    base = made("tiny-sd")
    pid = next(s["pid"] for s in server.status()["slots"] if s["model"] == "tiny-sd")
    sketched = made("tiny-sd-sketch")
    assert np.abs(sketched - base).mean() > 2, np.abs(sketched - base).mean()
    assert np.abs(made("tiny-sd") - base).mean() == 0  # nothing left on
    assert np.abs(made("tiny-sd-faint") - base).mean() == 0
    edited = client(server).images.edit(model="tiny-sd-sketch", prompt="x", size="64x64",
                                        image=("in.png", png(picture()), "image/png"),
                                        extra_body={"steps": 2})
    assert pixels(edited.data[0].b64_json).shape == (64, 64, 3)
    slots = [s for s in server.status()["slots"] if s["model"].startswith("tiny-sd")]
    assert [(s["model"], s["pid"]) for s in slots] == [("tiny-sd", pid)]
    assert slots[0]["adapters"] == ["tiny-sd-sketch", "tiny-sd-faint"]


def test_automatic1111_routes(server):
    models = httpx.get(server.url + "/sdapi/v1/sd-models").json()
    assert {"tiny-sd", "plain-sd"} <= {m["title"] for m in models}
    made = httpx.post(server.url + "/sdapi/v1/txt2img", timeout=300, json={
        "prompt": "a red square", "width": 64, "height": 96, "steps": 2, "seed": 4,
        "batch_size": 2, "override_settings": {"sd_model_checkpoint": "tiny-sd"}})
    assert made.status_code == 200, made.text
    answer = made.json()
    assert len(answer["images"]) == 2 and pixels(answer["images"][0]).shape == (96, 64, 3)
    assert '"seed":4' in answer["info"] and answer["parameters"]["steps"] == 2
    white = Image.new("L", (SIDE, SIDE), 0)
    white.paste(255, (16, 16, 48, 48))
    edited = httpx.post(server.url + "/sdapi/v1/img2img", timeout=300, json={
        "prompt": "a red square", "model": "tiny-sd", "steps": 2, "width": 64, "height": 64,
        "denoising_strength": 0.5, "init_images": [base64.b64encode(png(picture())).decode()],
        "mask": base64.b64encode(png(white)).decode()})
    assert edited.status_code == 200, edited.text
    assert pixels(edited.json()["images"][0]).shape == (64, 64, 3)


def test_an_edit_as_a_job(server):
    image = base64.b64encode(png(picture())).decode()
    job = httpx.post(server.url + "/api/v1/jobs", json={"endpoint": "/v1/images/edits", "body": {
        "model": "tiny-sd", "prompt": "x", "image": f"data:image/png;base64,{image}",
        "size": "64x64", "steps": 2}}).json()
    from tests.conftest import wait_for

    done = wait_for(lambda: (j := httpx.get(f"{server.url}/api/v1/jobs/{job['id']}").json())
                    ["status"] in ("succeeded", "failed") and j, timeout=120)
    assert done["status"] == "succeeded", done
    assert pixels(done["result"]["data"][0]["b64_json"]).shape == (64, 64, 3)
    refused = httpx.post(server.url + "/api/v1/jobs", json={"endpoint": "/v1/images/edits",
                                                            "body": {"model": "tiny-sd",
                                                                     "prompt": "x",
                                                                     "image": "bm90IGFuIGltYWdl"}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "image"


BAD = [
    ("a text file", {"image": ("in.png", b"not a picture at all", "image/png")}, "image"),
    ("a mask of another size", {"mask": ("m.png", mask_png((0, 0, 8, 8), side=32),
                                         "image/png")}, "mask"),
    ("a mask with nothing to repaint", {"mask": ("m.png", png(Image.new("RGBA", (SIDE, SIDE),
                                                                      (0, 0, 0, 255))),
                                                 "image/png")}, "mask"),
    ("a mask with no alpha", {"mask": ("m.png", png(picture()), "image/png")}, "mask"),
    ("a picture past max_image_side", {"image": ("big.png", png(picture(side=520)),
                                                 "image/png")}, "image"),
    ("a reference for a model with no IP-Adapter", {"reference_images[]": (
        "r.png", png(picture()), "image/png"), "model": "plain-sd"}, "reference_images"),
    ("a reference that is no picture", {"reference_images[]": ("r.png", b"nope", "image/png")},
     "reference_images.0"),
    ("a strength of 0", {"strength": "0"}, "strength"),
    ("an image model for the LLM", {"model": "smol"}, "model"),
]


def loads(server) -> dict[str, tuple[int, str]]:
    """Each model's slot: the loads it has had and its state."""
    return {s["key"]: (s["loads"], s["state"]) for s in server.status()["slots"]}


@pytest.mark.parametrize("what, change, param", BAD, ids=[b[0] for b in BAD])
def test_bad_pictures_are_400_before_any_load(server, what, change, param):
    files = {"image": ("in.png", png(picture()), "image/png")}
    data = {"model": "tiny-sd", "prompt": "x"}
    for name, value in change.items():
        (files if isinstance(value, tuple) else data)[name] = value
    before = loads(server)
    answer = httpx.post(server.url + "/v1/images/edits", files=files, data=data, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert "Traceback" not in error["message"] and "/tmp/" not in error["message"]
    # no load of the model it named (loaded by an earlier test or not), nor of any other:
    # every slot has had the loads it had, and none is loading
    after = loads(server)
    assert all(count == before.get(key, (0, ""))[0] for key, (count, _) in after.items()), \
        (before, after)
    assert not any(state == "loading" for _, state in after.values()), after


def test_an_upload_past_max_upload_bytes_is_413(server):
    noise = np.random.default_rng(0).integers(0, 255, (512, 512, 3), dtype=np.uint8)
    big = png(Image.fromarray(noise)) * 3
    answer = httpx.post(server.url + "/v1/images/edits", timeout=60,
                        files={"image": ("big.png", big, "image/png")},
                        data={"model": "tiny-sd", "prompt": "x"})
    assert answer.status_code == 413, answer.text
