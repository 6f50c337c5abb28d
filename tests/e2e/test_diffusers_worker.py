"""The diffusers worker as the coordinator sees it: a real process serving a real (tiny,
random-weight) StableDiffusionPipeline loaded with ``from_pretrained``."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_for
from tests.diffusion_fixtures import build_tiny_sd_pipeline
from tests.lazy_modules import lazy

Image = lazy("PIL.Image")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``python -m workers.diffusers`` on a free port, its output kept in a file."""

    def __init__(self, model: Path, log_dir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"worker-{self.port}.log"
        self.early: list[dict] = []  # /health bodies seen before the pipeline was ready
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.diffusers", "--model", str(model),
                 "--port", str(self.port), "--parent-pid", str(os.getpid()), *extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def health(self) -> httpx.Response | None:
        try:
            return httpx.get(self.url + "/health", timeout=2)
        except httpx.HTTPError:
            return None

    def wait_state(self, state: str, timeout: float = 120) -> dict:
        def reached() -> dict | None:
            assert self.proc.poll() is None, self.log_path.read_text()
            answer = self.health()
            if answer is None:
                return None
            if answer.json()["state"] == state:
                return answer.json()
            self.early.append(answer.json())
            return None

        return wait_for(reached, timeout=timeout, interval=0.1)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=120, **kwargs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def worker(tiny_sd, tmp_path_factory):
    proc = WorkerProcess(tiny_sd, tmp_path_factory.mktemp("logs"))
    proc.wait_state("ready")
    yield proc
    proc.stop()


def _png(b64: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    image.load()
    return image


def test_health_while_loading_then_ready(worker):
    assert worker.early  # torch imports in the loading thread: a second or more of 503s
    fractions = []
    for early in worker.early:
        assert early["state"] == "loading" and early["loads_from_disk"] == 0
        assert early["footprint_mb"] is None and early["error"] is None
        assert early["load"]["stage"] == "loading"  # with components counted once known
        fractions.append(-1 if early["load"]["fraction"] is None else early["load"]["fraction"])
    assert fractions == sorted(fractions)
    health = worker.health().json()
    assert health["load"] is None
    assert health["state"] == "ready" and health["tier"] == "gpu"
    assert health["device"] == "cpu" and health["dtype"] == "float32"
    assert health["offload"] == "none" and health["can_offload"] is True
    assert health["loads_from_disk"] == 1 and 0 < health["load_s"] < health["ready_s"]
    assert 1 <= health["footprint_mb"] < 50
    assert health["memory"]["rss_mb"] > 100 and health["generating"] is False


def test_load_progress_counts_the_pipeline_components(tiny_sd):
    """In-process: diffusers' component loop is counted one component at a time."""
    from workers.diffusers.loader import LoadProgress, load_pipeline
    from workers.diffusers.options import parse_args

    progress = LoadProgress()
    seen: list[tuple[int, int]] = []
    count = progress._count

    def watched(items):
        for item in count(items):
            seen.append((progress.loaded, progress.components))
            yield item

    progress._count = watched
    load_pipeline(parse_args(["--model", str(tiny_sd), "--port", "1"]), progress)
    n = progress.components
    assert n >= 5 and seen == [(done, n) for done in range(n)]
    assert progress.to_dict()["fraction"] == 1.0 and progress.placing


def test_generate_two_images(worker):
    answer = worker.post("/generate", json={"prompt": "a red square", "width": 64,
                                            "height": 64, "steps": 4, "n": 2, "seed": 7})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["images"]) == 2
    assert all(_png(image).size == (64, 64) for image in body["images"])
    assert body["seed"] == 7 and body["device"] == "cpu"
    timings = body["timings"]
    assert set(timings) >= {"queue_s", "denoise_s", "decode_s", "total_s"}
    assert timings["denoise_s"] > 0 and timings["total_s"] >= timings["denoise_s"]
    decision = body["memory_decisions"]
    assert decision["vae"] == "cpu-device" and decision["estimated_decode_mb"] == 25
    assert decision["free_mb"] is None and decision["reason"]
    progress = httpx.get(worker.url + "/progress").json()
    assert progress["step"] == progress["steps"] == 4 and progress["state"] == "done"
    same = worker.post("/generate", json={"prompt": "a red square", "width": 64,
                                          "height": 64, "steps": 4, "n": 2, "seed": 7})
    assert same.json()["images"] == body["images"]  # a seed reproduces the images


def test_non_square_size(worker):
    body = worker.post("/generate", json={"prompt": "x", "width": 96, "height": 64,
                                          "steps": 1}).json()
    assert [_png(image).size for image in body["images"]] == [(96, 64)]


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "width": 63, "height": 64}, "width"),
    ({"prompt": "x", "width": 64, "height": 0}, "height"),
    ({"prompt": "x", "width": 8192}, "width"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "   "}, "prompt"),
    ({"width": 64}, "prompt"),
    ({"prompt": "x", "steps": 0}, "steps"),
    ({"prompt": "x", "n": 11}, "n"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "sampler": "euler"}, "sampler"),
])
def test_bad_input_is_a_400_envelope(worker, body, param):
    answer = worker.post("/generate", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"] and "code" in error


def test_malformed_json_is_a_400_envelope(worker):
    answer = worker.post("/generate", content=b"{not json",
                         headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_offload_to_ram_and_back_without_reloading(worker):
    offload = worker.post("/offload")
    assert offload.status_code == 200
    assert offload.json()["tier"] == "cpu" and offload.json()["freed_mb"] > 0
    assert offload.json()["seconds"] >= 0
    again = worker.post("/offload").json()  # idempotent
    assert again["tier"] == "cpu" and again["freed_mb"] == 0
    assert worker.health().json()["tier"] == "cpu"
    onload = worker.post("/onload").json()
    assert onload["tier"] == "gpu" and onload["seconds"] >= 0
    assert worker.post("/onload").json()["tier"] == "gpu"
    body = worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                          "steps": 2}).json()
    assert _png(body["images"][0]).size == (64, 64)
    health = worker.health().json()
    assert health["tier"] == "gpu" and health["loads_from_disk"] == 1
    assert health["transitions"][-4:] == ["ready->offloading", "offloading->offloaded",
                                          "offloaded->onloading", "onloading->ready"]


def test_generate_while_offloaded_is_refused_not_run_on_the_cpu_copy(worker):
    assert worker.post("/offload").status_code == 200
    try:
        refused = worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                                 "steps": 1, "request_id": "parked"})
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "pipeline_offloaded"
        assert error["type"] == "invalid_request_error" and "onload" in error["message"]
        health = worker.health()
        assert health.status_code == 200  # alive and loaded, only parked
        assert health.json()["state"] == "offloaded" and health.json()["tier"] == "cpu"
        assert health.json()["generating"] is False
        assert httpx.get(worker.url + "/progress").json()["request_id"] != "parked"
    finally:
        assert worker.post("/onload").json()["tier"] == "gpu"
    assert worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                          "steps": 1}).status_code == 200


def test_offload_refused_while_generating_and_cancel(worker):
    result: dict = {}

    def long_generation() -> None:
        result["answer"] = worker.post("/generate", json={"prompt": "x", "width": 64,
                                                          "height": 64, "steps": 200,
                                                          "request_id": "refused-long"})

    thread = threading.Thread(target=long_generation)
    thread.start()
    try:  # this generation's steps: /progress shows the last one until it begins
        wait_for(lambda: _denoising(worker, "refused-long"), timeout=30,
                 what=lambda: httpx.get(worker.url + "/progress").json())
        health = worker.health().json()  # answers during a generation
        assert health["generating"] is True and health["progress"]["steps"] == 200
        for path in ("/offload", "/onload"):
            refused = worker.post(path)
            assert refused.status_code == 409
            assert refused.json()["error"]["code"] == "busy"
        cancel = worker.post("/cancel").json()
        assert cancel["cancelling"] is True and len(cancel["request_ids"]) == 1
    finally:
        thread.join(60)
    assert result["answer"].status_code == 409
    assert result["answer"].json()["error"]["code"] == "cancelled"
    progress = httpx.get(worker.url + "/progress").json()
    assert progress["state"] == "cancelled" and progress["step"] < 200
    assert worker.health().json()["generating"] is False


class Background:
    """One ``POST /generate`` in a thread; ``answer`` once it returns."""

    def __init__(self, worker: WorkerProcess, **body) -> None:
        self.answer: httpx.Response | None = None
        self.thread = threading.Thread(target=self._run, args=(worker, body))
        self.thread.start()

    def _run(self, worker: WorkerProcess, body: dict) -> None:
        self.answer = worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                                     **body})

    def result(self, timeout: float = 60) -> httpx.Response:
        self.thread.join(timeout)
        assert self.answer is not None, "the generation did not answer"
        return self.answer


def _admitted(worker: WorkerProcess, request_id: str) -> bool:
    return request_id in worker.health().json()["request_ids"]


def _cancel(worker: WorkerProcess, request_id: str | None = None) -> dict:
    body = {"json": {"request_id": request_id}} if request_id else {}
    answer = worker.post("/cancel", **body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _denoising(worker: WorkerProcess, request_id: str) -> bool:
    """``request_id``'s generation has taken a denoising step (not an earlier one's)."""
    progress = httpx.get(worker.url + "/progress").json()
    return progress.get("request_id") == request_id and progress["step"] >= 1


def test_cancel_before_denoising_starts_stops_that_generation_only(worker):
    running = Background(worker, steps=200, request_id="long-a")
    wait_for(lambda: _denoising(worker, "long-a"), timeout=30,
             what=lambda: httpx.get(worker.url + "/progress").json())
    queued = Background(worker, steps=2, request_id="queued-b")  # waits for the weights
    wait_for(lambda: _admitted(worker, "queued-b"), timeout=30)
    duplicate = worker.post("/generate", json={"prompt": "x", "steps": 1,
                                               "request_id": "long-a"})
    assert duplicate.status_code == 409
    assert duplicate.json()["error"]["code"] == "duplicate_request_id"
    assert _cancel(worker, "queued-b") == {"cancelling": True, "request_ids": ["queued-b"],
                                           "outcome": "cancelling"}
    answer = queued.result()
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled"
    progress = httpx.get(worker.url + "/progress").json()
    assert progress["request_id"] == "long-a" and progress["state"] == "running"
    assert _cancel(worker, "long-a")["cancelling"] is True
    assert running.result().json()["error"]["code"] == "cancelled"
    progress = httpx.get(worker.url + "/progress").json()
    assert progress["request_id"] == "long-a" and progress["state"] == "cancelled"
    assert progress["step"] < 200  # "queued-b" never started denoising


def test_untargeted_cancel_right_after_admission_is_not_lost(worker):
    for attempt in range(3):  # the cancel lands before, or early in, the denoising loop
        doomed = Background(worker, steps=200, request_id=f"doomed-{attempt}")
        wait_for(lambda a=attempt: _admitted(worker, f"doomed-{a}"), timeout=30, interval=0.01)
        assert _cancel(worker)["request_ids"] == [f"doomed-{attempt}"]
        answer = doomed.result()
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled"
        assert httpx.get(worker.url + "/progress").json()["step"] < 200


def test_cancel_that_overtakes_its_generation_still_stops_it(worker):
    early = _cancel(worker, "not-yet-sent")
    assert early == {"cancelling": False, "request_ids": [], "outcome": "remembered"}
    answer = worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                            "steps": 2, "request_id": "not-yet-sent"})
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled"


def test_stale_cancel_does_not_reach_the_next_generation(worker):
    first = worker.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                           "steps": 1, "request_id": "over"})
    assert first.status_code == 200 and first.json()["request_id"] == "over"
    # between two jobs: nothing is admitted, so nothing is cancelled or remembered
    assert _cancel(worker) == {"cancelling": False, "request_ids": [], "outcome": "none"}
    assert _cancel(worker, "over")["outcome"] == "finished"
    for request_id in (None, "over"):  # a new id, and the finished id used again
        body = {"prompt": "x", "width": 64, "height": 64, "steps": 3}
        answer = worker.post("/generate", json={**body, "request_id": request_id}
                             if request_id else body)
        assert answer.status_code == 200, answer.text
        progress = httpx.get(worker.url + "/progress").json()
        assert progress["state"] == "done" and progress["step"] == 3


def test_failed_load_reports_the_error_then_shutdown(tmp_path):
    empty = tmp_path / "not-a-pipeline"
    empty.mkdir()
    proc = WorkerProcess(empty, tmp_path)
    try:
        health = proc.wait_state("failed")
        assert proc.health().status_code == 503
        assert "model_index.json" in health["error"] and health["loads_from_disk"] == 0
        # found before importing torch and diffusers (seconds of CPU) to find the same
        assert health["memory"]["rss_mb"] < 200, health["memory"]
        refused = proc.post("/generate", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        assert proc.post("/offload").status_code == 503
        assert proc.post("/shutdown").json() == {"stopping": True}
        assert proc.proc.wait(timeout=10) == 0
    finally:
        proc.stop()


def test_sigterm_mid_generation_exits_promptly(tiny_sd, tmp_path):
    proc = WorkerProcess(tiny_sd, tmp_path)
    try:
        proc.wait_state("ready")
        thread = threading.Thread(target=lambda: _ignore_errors(
            proc.post, "/generate", json={"prompt": "x", "width": 64, "height": 64,
                                          "steps": 200}))
        thread.start()
        wait_for(lambda: httpx.get(proc.url + "/progress").json()["step"] >= 1, timeout=30)
        started = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(timeout=15) == 0
        took = time.monotonic() - started
        assert took < 5, f"exited {took:.2f}s after SIGTERM; its log:\n" \
                         f"{proc.log_path.read_text()[-3000:]}"
        thread.join(10)
    finally:
        proc.stop()


def test_dies_with_its_parent(tmp_path):
    """PR_SET_PDEATHSIG: no --parent-pid here, the kernel kills the orphan. Its model is a
    folder that is not a pipeline (the load fails at once, the worker stays up to say so):
    the signal comes from the kernel, whatever the worker is doing."""
    pid_file, port, model = tmp_path / "pid", free_port(), tmp_path / "not-a-pipeline"
    model.mkdir()
    spawner = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'workers.diffusers', '--model', "
        f"{str(model)!r}, '--port', '{port}'], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)\n")], cwd=ROOT)
    try:
        pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30))

        def serving() -> bool:  # the HTTP server starts after the prctl call
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1) is not None
            except httpx.HTTPError:
                return False

        wait_for(serving, timeout=60)
        assert _alive(pid)
        spawner.kill()
        spawner.wait()
        wait_for(lambda: not _alive(pid), timeout=5)
    finally:
        spawner.kill()
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ignore_errors(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except httpx.HTTPError:
        pass


# ids not named "gpu": the conftest skips every test with a "gpu" keyword on a CPU box
@pytest.mark.parametrize("mode", ["gpu", "tiled", "cpu", "cpu-device"],
                         ids=lambda mode: f"vae-{mode}")
def test_every_decode_mode_on_the_real_vae(tiny_sd, mode):
    """The modes a GPU box picks, carried out here on the CPU by the same code."""
    import torch
    from diffusers import DiffusionPipeline

    from workers.diffusers.memory import VaeMode, decode_latents

    # the CPU decode runs in float32 and must hand back the VAE in its own dtype
    dtype = torch.bfloat16 if mode == "cpu" else torch.float32
    pipe = DiffusionPipeline.from_pretrained(tiny_sd, local_files_only=True, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    latents = pipe(prompt="x", width=64, height=64, num_inference_steps=1,
                   num_images_per_prompt=2, output_type="latent").images
    vae = pipe.vae
    images = decode_latents(pipe, latents, 64, 64, VaeMode(mode), torch.device("cpu"),
                            hooks=None)
    assert [image.size for image in images] == [(64, 64), (64, 64)]
    assert vae.use_tiling is False  # tiling is switched off again after a tiled decode
    assert next(vae.parameters()).device.type == "cpu"
    assert vae.dtype == dtype


@pytest.mark.gpu
def test_offload_frees_vram_and_onload_beats_a_cold_load(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = build_tiny_sd_pipeline(tmp_path_factory.mktemp("gpu") / "sd", width=256)
    proc = WorkerProcess(path, tmp_path_factory.mktemp("gpu-logs"), "--device", "cuda")
    try:
        health = proc.wait_state("ready", timeout=300)
        assert health["device"] == "cuda" and health["tier"] == "gpu"
        allocated = health["memory"]["cuda_allocated_mb"]
        assert allocated >= health["footprint_mb"] * 0.9
        offload = proc.post("/offload").json()
        assert offload["tier"] == "cpu" and offload["freed_mb"] >= allocated * 0.9
        assert proc.health().json()["memory"]["cuda_allocated_mb"] <= allocated * 0.1
        onload = proc.post("/onload").json()
        assert onload["tier"] == "gpu" and onload["seconds"] < health["load_s"]
        assert proc.health().json()["memory"]["cuda_allocated_mb"] >= allocated * 0.9
        body = proc.post("/generate", json={"prompt": "x", "width": 64, "height": 64,
                                            "steps": 2}).json()
        assert body["memory_decisions"]["vae"] in ("gpu", "tiled")
        assert body["memory_decisions"]["free_mb"] > 0
        assert proc.health().json()["loads_from_disk"] == 1
    finally:
        proc.stop()
