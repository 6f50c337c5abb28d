"""``workers.diffusers.references`` without a pipeline: where ``--ip-adapter`` finds its files,
and how a reference image is decoded or refused."""

from __future__ import annotations

import base64
import io

import pytest

from workers.diffusers.errors import InvalidRequest
from workers.diffusers.media.pictures import decode_picture
from workers.diffusers.options import parse_args
from workers.diffusers.references import adapter_files


def _folder(tmp_path, *names: str, encoder: bool = True):
    for name in names:
        (tmp_path / name).write_bytes(b"weights")
    if encoder:
        (tmp_path / "image_encoder").mkdir()
    return tmp_path


def test_a_weights_file_and_the_encoder_beside_it(tmp_path):
    folder = _folder(tmp_path, "ip-adapter_sd15.safetensors", "ip-adapter_sd15.bin")
    files = adapter_files(str(folder / "ip-adapter_sd15.bin"))
    assert (files.folder, files.weight_name) == (folder, "ip-adapter_sd15.bin")
    assert files.image_encoder == folder / "image_encoder"


def test_a_folder_with_one_adapter_file(tmp_path):
    folder = _folder(tmp_path, "ip-adapter.safetensors", "README.md")
    files = adapter_files(str(folder))
    assert files.weights == folder / "ip-adapter.safetensors"


def test_an_encoder_named_elsewhere_and_none_at_all(tmp_path):
    folder = _folder(tmp_path, "a.safetensors", encoder=False)
    assert adapter_files(str(folder)).image_encoder is None  # the pipeline's own, if any
    elsewhere = tmp_path / "clip"
    elsewhere.mkdir()
    assert adapter_files(str(folder), str(elsewhere)).image_encoder == elsewhere
    with pytest.raises(OSError, match="--ip-adapter-image-encoder"):
        adapter_files(str(folder), str(tmp_path / "missing"))


@pytest.mark.parametrize("names, match", [
    (("a.safetensors", "b.safetensors"), "found \\['a.safetensors', 'b.safetensors'\\]"),
    ((), "found none"),
])
def test_a_folder_that_does_not_name_one_adapter(tmp_path, names, match):
    with pytest.raises(OSError, match=match):
        adapter_files(str(_folder(tmp_path, *names)))


def test_a_missing_adapter(tmp_path):
    with pytest.raises(OSError, match="--ip-adapter .*: no such file or folder"):
        adapter_files(str(tmp_path / "nothing-here"))


def test_the_flags():
    options = parse_args(["--model", "m", "--port", "1", "--ip-adapter", "a.safetensors",
                          "--ip-adapter-image-encoder", "enc"])
    assert (options.ip_adapter, options.ip_adapter_image_encoder) == ("a.safetensors", "enc")
    assert parse_args(["--model", "m", "--port", "1"]).ip_adapter is None
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--port", "1", "--ip-adapter-image-encoder", "enc"])


def _encoded(fmt: str, mode: str = "RGBA") -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, (5, 3), "red").save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


# the one picture decoder of the worker: an edit's picture and mask, a reference, a video's
# first frame
@pytest.mark.parametrize("fmt, mode", [("PNG", "RGBA"), ("JPEG", "L"), ("WEBP", "RGB")])
def test_pictures_decode_to_the_mode_asked(fmt, mode):
    image = decode_picture(_encoded(fmt, mode), "reference_images.0")
    assert image.mode == "RGB" and image.size == (5, 3)
    assert decode_picture(_encoded(fmt, mode), "mask", "L").mode == "L"


def test_a_data_url_with_line_breaks():
    data = _encoded("PNG")
    wrapped = "\n".join(data[i:i + 20] for i in range(0, len(data), 20))
    assert decode_picture("data:image/png;base64," + wrapped, "image").size == (5, 3)


@pytest.mark.parametrize("param", ["image", "mask", "reference_images.3"])
@pytest.mark.parametrize("data, reason", [
    ("%%%", "not base64"),
    (base64.b64encode(b"text").decode(), "not a PNG, JPEG or WebP image"),
    (_encoded("GIF", "P"), "not a PNG, JPEG or WebP image"),
    (_encoded("PNG")[:40], "not a PNG, JPEG or WebP image"),  # cut short
])
def test_what_is_not_a_picture(data, reason, param):
    with pytest.raises(InvalidRequest) as caught:
        decode_picture(data, param)
    assert caught.value.param == param and caught.value.status == 400
    assert str(caught.value).startswith(f"{param}: not a picture") and reason in str(caught.value)


def test_a_decompression_bomb_is_refused(monkeypatch):
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4)  # 5x3 is past twice that: a bomb here
    with pytest.raises(InvalidRequest) as caught:
        decode_picture(_encoded("PNG"), "image")
    assert "DecompressionBombError" in str(caught.value) and caught.value.param == "image"
