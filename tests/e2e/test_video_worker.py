"""The diffusers worker serving video: a real process with a tiny random-weight Wan text-to-
video pipeline (and an LTX image-to-video one), loaded with ``from_pretrained``."""

from __future__ import annotations

import base64
import io
import threading

import httpx
import pytest

from tests.conftest import wait_for
from tests.e2e.test_diffusers_worker import WorkerProcess
from tests.lazy_modules import lazy
from tests.video_fixtures import shared_tiny_i2v, shared_tiny_video

av = lazy("av")
Image = lazy("PIL.Image")

pytestmark = pytest.mark.slow

# 9 frames of 32x32 in 2 steps: a second or two here; guidance 1 skips the unconditional pass
SMALL = {"prompt": "a red square", "width": 32, "height": 32, "frames": 9, "steps": 2,
         "guidance": 1.0}


@pytest.fixture(scope="module")
def video_worker(tmp_path_factory):
    proc = WorkerProcess(shared_tiny_video(tmp_path_factory), tmp_path_factory.mktemp("logs"))
    proc.wait_state("ready")
    yield proc
    proc.stop()


def _decoded(body: dict) -> list:
    """The answer's MP4, decoded to its frames (PyAV)."""
    assert body["content_type"] == "video/mp4"
    with av.open(io.BytesIO(base64.b64decode(body["video"]))) as container:
        assert "mp4" in container.format.name
        assert container.streams.video[0].average_rate == body["fps"]
        return list(container.decode(video=0))


def _progress(worker: WorkerProcess) -> dict:
    return httpx.get(worker.url + "/progress", timeout=10).json()


class BackgroundVideo:
    """One ``POST /video`` in a thread; ``result()`` once it answers."""

    def __init__(self, worker: WorkerProcess, **body) -> None:
        self.answer: httpx.Response | None = None
        self.thread = threading.Thread(
            target=lambda: setattr(self, "answer", worker.post("/video", json={**SMALL,
                                                                               **body})))
        self.thread.start()

    def result(self, timeout: float = 120) -> httpx.Response:
        self.thread.join(timeout)
        assert self.answer is not None, "the video did not answer"
        return self.answer


def test_video_is_an_mp4_of_the_reported_frames_and_size(video_worker):
    # 6 frames asked: Wan's VAE folds 4 frames into one, so 4k+1 = 9 are made (never fewer)
    answer = video_worker.post("/video", json={**SMALL, "width": 48, "frames": 6, "fps": 8,
                                               "seed": 5, "request_id": "clip-1"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["frames"], body["fps"], body["width"], body["height"]) == (9, 8, 48, 32)
    assert body["seed"] == 5 and body["request_id"] == "clip-1" and body["device"] == "cpu"
    assert body["codec"] in ("libx264", "mpeg4")
    frames = _decoded(body)
    assert len(frames) == 9 and {(f.width, f.height) for f in frames} == {(48, 32)}
    timings = body["timings"]
    assert set(timings) == {"queue_s", "denoise_s", "decode_s", "encode_s", "total_s",
                            "steps", "step_end_s"}
    assert timings["steps"] == len(timings["step_end_s"]) == 2
    assert timings["denoise_s"] > 0 and timings["decode_s"] > 0
    assert timings["total_s"] >= timings["denoise_s"] + timings["decode_s"]
    progress = _progress(video_worker)
    assert progress["request_id"] == "clip-1" and progress["state"] == "done"
    assert progress["step"] == progress["steps"] == 2


def test_progress_rises_then_cancel_stops_the_video(video_worker):
    # 200 steps with guidance over 17 frames of 64x64: tens of seconds, stopped long before
    running = BackgroundVideo(video_worker, steps=200, guidance=5.0, frames=17, width=64,
                              height=64, request_id="clip-long")
    seen: list[int] = []

    def rising() -> bool:
        progress = _progress(video_worker)
        if progress["request_id"] == "clip-long" and progress["step"] >= 1:
            assert progress["state"] == "running" and progress["steps"] == 200
            seen.append(progress["step"])
        return len(set(seen)) >= 3

    try:
        wait_for(rising, timeout=120, interval=0.05, what=lambda: _progress(video_worker))
        assert seen == sorted(seen)
        health = video_worker.health().json()
        assert health["generating"] is True and health["request_ids"] == ["clip-long"]
        assert video_worker.post("/offload").json()["error"]["code"] == "busy"
        cancel = video_worker.post("/cancel", json={"request_id": "clip-long"}).json()
        assert cancel == {"cancelling": True, "request_ids": ["clip-long"],
                          "outcome": "cancelling"}
    finally:
        answer = running.result()
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled"
    progress = _progress(video_worker)
    assert progress["state"] == "cancelled" and seen[-1] <= progress["step"] < 200
    assert video_worker.health().json()["generating"] is False


@pytest.mark.parametrize("body, param", [
    ({"width": 40}, "width"),  # Wan: multiples of 16
    ({"height": 36}, "height"),  # not even a multiple of 8
    ({"frames": 0}, "frames"),
    ({"fps": 61}, "fps"),
    ({"image": base64.b64encode(b"\x89PNG").decode()}, "image"),  # text-to-video only
    ({"sampler": "euler"}, "sampler"),
])
def test_bad_video_request_is_a_400_envelope(video_worker, body, param):
    answer = video_worker.post("/video", json={**SMALL, **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["code"] == "invalid_request" and error["message"]


def test_generate_on_a_video_model_is_refused(video_worker):
    answer = video_worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "unsupported_endpoint" and "POST /video" in error["message"]


def test_video_on_an_image_model_is_refused(tiny_sd, tmp_path):
    proc = WorkerProcess(tiny_sd, tmp_path)
    try:
        proc.wait_state("ready")
        answer = proc.post("/video", json=SMALL)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "unsupported_endpoint" and "POST /generate" in error["message"]
        assert proc.health().json()["generating"] is False
    finally:
        proc.stop()


def test_offload_then_onload_then_another_video(video_worker):
    offload = video_worker.post("/offload")
    assert offload.status_code == 200 and offload.json()["tier"] == "cpu"
    try:
        refused = video_worker.post("/video", json=SMALL)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "pipeline_offloaded"
    finally:
        assert video_worker.post("/onload").json()["tier"] == "gpu"
    answer = video_worker.post("/video", json={**SMALL, "seed": 9})
    assert answer.status_code == 200, answer.text
    assert len(_decoded(answer.json())) == answer.json()["frames"] == 9
    health = video_worker.health().json()
    assert health["loads_from_disk"] == 1
    assert health["transitions"][-4:] == ["ready->offloading", "offloading->offloaded",
                                          "offloaded->onloading", "onloading->ready"]


def test_image_to_video(tmp_path_factory, tmp_path):
    proc = WorkerProcess(shared_tiny_i2v(tmp_path_factory), tmp_path)
    try:
        proc.wait_state("ready")
        missing = proc.post("/video", json=SMALL)
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "image"
        buffer = io.BytesIO()
        Image.new("RGB", (40, 24), "red").save(buffer, format="PNG")
        answer = proc.post("/video", json={
            **SMALL, "frames": 7, "image": base64.b64encode(buffer.getvalue()).decode()})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        # this LTX VAE folds 4 frames into one: 7 asked, 9 made
        assert (body["frames"], body["width"], body["height"]) == (9, 32, 32)
        assert len(_decoded(body)) == 9
    finally:
        proc.stop()
