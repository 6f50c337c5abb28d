"""One rule for a picture sent as text (workers/pictures.py), read by the coordinator before
any load (services/media/pictures.py: a 400 ``invalid_image``) and by the diffusers worker
(workers/diffusers/media/pictures.py: its own 400): both take and refuse the same pictures."""

from __future__ import annotations

import base64
import io

import pytest

from model_boss.errors import BadRequest
from model_boss.services.media.pictures import from_text, open_picture
from workers.diffusers.errors import InvalidRequest
from workers.diffusers.media.pictures import decode_picture


def encoded(fmt: str = "PNG", size: tuple[int, int] = (5, 3), mode: str = "RGB") -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, size, "red").save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def wrapped(text: str, width: int = 20) -> str:
    return "\n".join(text[i:i + width] for i in range(0, len(text), width))


PNG = encoded()
BIG = encoded(size=(60, 60))

# (what is sent, the coordinator's reason where refused: None where taken)
CASES = [
    (PNG, None),
    (encoded("JPEG"), None),
    (encoded("WEBP"), None),
    ("data:image/png;base64," + PNG, None),
    ("data:image/png;base64," + wrapped(PNG), None),  # line breaks, as MIME writes base64
    ("  " + PNG + "\n", None),
    ("", "must be a picture as base64 (or a data: URL)"),
    ("%%%", "is not valid base64"),
    ("data:image/png;base64,%%%", "is not valid base64"),
    (base64.b64encode(b"text").decode(), "is not a picture (send a PNG, JPEG or WebP)"),
    (encoded("GIF", mode="P"), "is not a picture (send a PNG, JPEG or WebP)"),
    (PNG[:40], "is not a picture (send a PNG, JPEG or WebP)"),  # cut inside its header
    (BIG[:len(BIG) // 8 * 4], "is not a whole picture (it could not be decoded)"),  # cut short
]


@pytest.mark.parametrize(("sent", "reason"), CASES)
def test_the_coordinator_and_the_worker_read_pictures_alike(sent, reason):
    try:
        picture = open_picture(from_text(sent, "image"), "image", 64)
    except BadRequest as exc:
        said = exc
    else:
        said = None
        assert picture.size == (5, 3)
    try:
        worker = decode_picture(sent, "image")
    except InvalidRequest as exc:
        worker_said = exc
    else:
        worker_said = None
        assert worker.size == (5, 3) and worker.mode == "RGB"
    assert (said is None, worker_said is None) == (reason is None, reason is None)
    if reason is not None:
        assert said.message == f"image: {reason}" and said.param == "image"
        assert said.code == "invalid_image" and said.status_code == 400
        assert worker_said.param == "image" and worker_said.status == 400


def test_a_picture_past_the_side_bound_is_refused_by_the_coordinator():
    with pytest.raises(BadRequest) as caught:
        open_picture(from_text(encoded(size=(80, 3)), "image"), "image", 64)
    assert caught.value.message == ("image: is 80x3; this server takes pictures up to 64 "
                                    "pixels a side (max_image_side)")


@pytest.mark.parametrize("limit", [4, 1])  # past it while loading; past twice it when opened
def test_a_decompression_bomb_is_a_400_on_both_sides(monkeypatch, limit):
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)  # 5x3 is a bomb here
    with pytest.raises(BadRequest) as caught:
        open_picture(from_text(PNG, "image"), "image", 64)
    assert caught.value.status_code == 400 and caught.value.code == "invalid_image"
    with pytest.raises(InvalidRequest) as worker:
        decode_picture(PNG, "image")
    assert "DecompressionBombError" in str(worker.value)
