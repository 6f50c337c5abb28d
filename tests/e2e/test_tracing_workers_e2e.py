"""The worker's part of a trace for the diffusers and transformers workers, through a real
coordinator exporting to the OTLP/HTTP receiver of the tracing tests: a picture's worker call
has the denoising (with the steps run, each step its own span) and the decode as its
children, as the worker's own timings say, and a clip's (a job's run) its MP4 encoding too;
an embedding request's has the batch it ran in (its items and requests, as the worker's
answer says). The models are the suite's tiny random-weight ones (a Stable Diffusion
pipeline, a Wan video pipeline and a BERT embedder, built with save_pretrained)."""

from __future__ import annotations

import asyncio
import importlib.util

import httpx
import pytest

from tests.conftest import ServerProcess, wait_for
from tests.otlp_receiver import Receiver, attributes, tracing_env
from tests.transformers_fixtures import build_embedder, shared
from tests.video_fixtures import shared_tiny_video

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                                 reason="the 'transformers' extra")]

PARENT_ID = "00f067aa0ba902b7"
PICTURE_TRACE_ID = "c1f92f3577b34da6a3ce929d0e0e4701"
CLIP_TRACE_ID = "c2f92f3577b34da6a3ce929d0e0e4702"
BATCH = 8  # the embedder's batch: four requests of two sentences fill it


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_sd):
    """The coordinator and the receiver its spans go to."""
    embedder = shared(tmp_path_factory, "embedder", build_embedder)
    manifests = [
        {"id": "tiny-sd", "category": "diffusion", "backend": "diffusers",
         "path": str(tiny_sd), "vram_mb": 3000},
        {"id": "tiny-wan", "category": "video", "backend": "diffusers",
         "path": str(shared_tiny_video(tmp_path_factory)), "vram_mb": 3000, "fps": 8},
        # a gathering is sent once it holds a whole batch (the quiet wait is long)
        {"id": "embed", "backend": "transformers", "category": "embedding",
         "path": str(embedder), "vram_mb": 1000, "batch_size": BATCH,
         "max_batch_wait_ms": 1000}]
    with Receiver() as receiver:
        srv = ServerProcess(tmp_path_factory.mktemp("tracing-workers"),
                            {"gpus": [{"index": 0, "name": "sim", "vram_mb": 16384}]},
                            manifests, env=tracing_env(receiver))
        srv.start()
        try:
            yield srv, receiver
        finally:
            srv.stop()


def traced(trace_id: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"}


def spans_of(receiver: Receiver, trace_id: str, names: set[str]) -> dict[str, list]:
    """The trace's spans by name (a list each), once every one of ``names`` has come."""
    def found() -> dict[str, list] | None:
        spans: dict[str, list] = {}
        for span in receiver.of_trace(trace_id):
            spans.setdefault(span.name, []).append(span)
        return spans if names <= spans.keys() else None

    return receiver.wait(found) or {}


def test_a_pictures_worker_call_has_its_denoising_steps_and_decode(served):
    server, receiver = served
    steps = 3
    answer = httpx.post(server.url + "/v1/images/generations", timeout=300,
                        headers=traced(PICTURE_TRACE_ID),
                        json={"model": "tiny-sd", "prompt": "a red square", "size": "64x64",
                              "x_steps": steps, "x_seed": 7})
    assert answer.status_code == 200, answer.text
    timings = answer.json()["x_model_boss"]["timings"]
    assert timings["steps"] == steps and len(timings["step_end_s"]) == steps
    names = {"model_boss.worker_call", "diffusers.denoise", "diffusers.step",
             "diffusers.decode"}
    spans = spans_of(receiver, PICTURE_TRACE_ID, names)
    assert names <= spans.keys(), sorted(spans)
    (worker,), (denoise,), (decode,) = (spans[name] for name in (
        "model_boss.worker_call", "diffusers.denoise", "diffusers.decode"))
    assert denoise.parent_span_id == worker.span_id == decode.parent_span_id
    assert attributes(worker)["model_boss.diffusion.steps"] == steps
    assert attributes(denoise)["model_boss.diffusion.steps"] == steps
    assert attributes(worker)["diffusers.timings.denoise_s"] == timings["denoise_s"]
    taken = sorted(spans["diffusers.step"], key=lambda span: span.start_time_unix_nano)
    assert [attributes(span)["model_boss.diffusion.step"] for span in taken] == [1, 2, 3]
    for span in taken:  # each step inside the denoising, one after another
        assert span.parent_span_id == denoise.span_id
        assert denoise.start_time_unix_nano <= span.start_time_unix_nano \
            <= span.end_time_unix_nano <= denoise.end_time_unix_nano
    for earlier, later in zip(taken, taken[1:], strict=False):
        assert earlier.end_time_unix_nano <= later.start_time_unix_nano
    assert denoise.end_time_unix_nano <= decode.start_time_unix_nano
    assert decode.end_time_unix_nano <= worker.end_time_unix_nano
    assert "a red square" not in str([span.attributes for span in receiver.of_trace(
        PICTURE_TRACE_ID)])  # no prompt text


def test_a_clips_worker_call_has_its_steps_decode_and_encoding(served):
    server, receiver = served
    made = httpx.post(server.url + "/v1/videos", timeout=60, headers=traced(CLIP_TRACE_ID),
                      json={"model": "tiny-wan", "prompt": "a red ball", "seconds": 1,
                            "size": "64x64", "steps": 2, "seed": 5})
    assert made.status_code == 200, made.text
    video_id = made.json()["id"]

    def finished() -> dict | None:
        video = httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=30).json()
        return video if video["status"] in ("completed", "failed") else None

    video = wait_for(finished, timeout=300)
    assert video["status"] == "completed", video
    job_id = video_id.removeprefix("video_")

    def the_run():  # the job's run: a trace of its own, linked to the submit
        return next((span for span in receiver.named("model_boss.job.run")
                     if attributes(span).get("model_boss.job.id") == job_id), None)

    run = receiver.wait(the_run)
    assert run is not None, "no run of the video's job"
    names = {"model_boss.worker_call", "diffusers.denoise", "diffusers.step",
             "diffusers.decode", "diffusers.encode"}
    spans = spans_of(receiver, run.trace_id.hex(), names)
    assert names <= spans.keys(), sorted(spans)
    (worker,), (denoise,) = spans["model_boss.worker_call"], spans["diffusers.denoise"]
    (decode,), (encode,) = spans["diffusers.decode"], spans["diffusers.encode"]
    assert worker.parent_span_id == run.span_id
    assert attributes(worker)["model_boss.diffusion.steps"] == 2
    assert len(spans["diffusers.step"]) == 2
    assert all(step.parent_span_id == denoise.span_id for step in spans["diffusers.step"])
    assert denoise.end_time_unix_nano <= decode.start_time_unix_nano \
        <= decode.end_time_unix_nano <= encode.start_time_unix_nano
    assert encode.parent_span_id == worker.span_id
    assert encode.end_time_unix_nano <= worker.end_time_unix_nano


def test_an_embedding_requests_worker_call_has_the_batch_it_ran_in(served):
    server, receiver = served
    warm = httpx.post(server.url + "/v1/embeddings", timeout=300, json={
        "model": "embed", "input": [f"warm {i}" for i in range(BATCH)]})  # a whole batch
    assert warm.status_code == 200, warm.text
    trace_ids = [f"e2f92f3577b34da6a3ce929d0e0e47{n:02x}" for n in range(4)]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(
                server.url + "/v1/embeddings", headers=traced(trace_id),
                json={"model": "embed", "input": [f"first {n}", f"second {n}"]})
                for n, trace_id in enumerate(trace_ids)))

    answers = asyncio.run(together())
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    for answer, trace_id in zip(answers, trace_ids, strict=True):
        batch = answer.json()["timings"]  # the worker's: the one batch of all four
        assert (batch["batch_size"], batch["batch_requests"]) == (BATCH, 4), batch
        spans = spans_of(receiver, trace_id, {"model_boss.worker_call", "transformers.batch"})
        (worker,), (ran,) = spans["model_boss.worker_call"], spans["transformers.batch"]
        assert ran.parent_span_id == worker.span_id
        on_worker, on_batch = attributes(worker), attributes(ran)
        assert on_batch["model_boss.batch.size"] == on_worker["model_boss.batch.size"] == BATCH
        assert on_batch["model_boss.batch.requests"] == 4
        assert on_worker["model_boss.batch.ms"] == batch["batch_ms"]
        assert on_batch["model_boss.batch.wait_ms"] == batch["batch_wait_ms"]
        assert worker.start_time_unix_nano <= ran.start_time_unix_nano \
            <= ran.end_time_unix_nano <= worker.end_time_unix_nano
