"""A waiting job's ``estimated_start`` (scheduling/waiting.py) against a queue of known lengths:
each request runs ``max_tokens`` × 10 ms, so once the model's rate is learned the estimate
must land within half of the real wait, whether the job waits behind its own model's
requests or behind another model that holds the GPU it needs."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest

from model_boss.backends.base import UpstreamResponse
from model_boss.scheduling.request import asked_work

from .fakes import FakeBackend, coordinator, manifest, started_client

S_PER_TOKEN = 0.01


@pytest.fixture(autouse=True)
def known_lengths(monkeypatch):
    """Every answer takes its ``max_tokens`` × 10 ms, as a model generating them would."""
    async def answer(self, endpoint, body, stream):
        await asyncio.sleep(body.get("max_tokens", 10) * S_PER_TOKEN)
        return UpstreamResponse(200, {"content-type": "application/json"},
                                body=b'{"choices": [], "usage": {"completion_tokens": 1}}')

    monkeypatch.setattr(FakeBackend, "handle_request", answer)


def chat(model: str, tokens: int) -> dict:
    return {"model": model, "max_tokens": tokens, "messages": [{"role": "user", "content": "x"}]}


async def _learn(client, model: str) -> None:
    """A few short requests of different lengths, one at a time: the model's rate is learned
    (and its mean request is short: a count of the requests ahead would say little)."""
    for tokens in (10, 30, 20):
        assert (await client.post("/v1/chat/completions", json=chat(model, tokens))) \
            .status_code == 200


async def _start(client, coord, model: str, tokens: int) -> asyncio.Task:
    """A request sent in the background, once the queue has it (running or waiting)."""
    before = coord.queue.granted_total + coord.queue.depth
    task = asyncio.create_task(client.post("/v1/chat/completions", json=chat(model, tokens)))
    for _ in range(200):
        if coord.queue.granted_total + coord.queue.depth > before:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the request never reached the queue")


async def _estimate_and_wait(client, job_body: dict) -> tuple[float, float]:
    """(the estimated wait a job is told once queued, the wait it really had), in seconds."""
    job = (await client.post("/api/v1/jobs", json={"endpoint": "/v1/chat/completions",
                                                   "body": job_body})).json()
    for _ in range(500):
        status = (await client.get(f"/api/v1/jobs/{job['id']}")).json()
        if status["queue_position"] is not None:
            break
        await asyncio.sleep(0.01)
    told_at = time.time()
    estimated = datetime.fromisoformat(status["estimated_start"]).timestamp() - told_at
    while status["queue_position"] is not None:
        await asyncio.sleep(0.02)
        status = (await client.get(f"/api/v1/jobs/{job['id']}")).json()
    return estimated, time.time() - told_at


async def test_behind_its_own_models_requests_the_estimate_is_within_half(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("m", 1000)])
    async with started_client(coord) as client:
        await _learn(client, "m")
        ahead = [await _start(client, coord, "m", tokens) for tokens in (200, 150, 250)]
        estimated, waited = await _estimate_and_wait(client, chat("m", 10))
        await asyncio.gather(*ahead)
    assert waited > 3.0  # 6 s of work ahead, less what the first had run
    print(f"estimated {estimated:.2f} s, waited {waited:.2f} s")
    assert abs(estimated - waited) <= 0.5 * waited, (estimated, waited)


async def test_behind_another_model_on_the_gpu_it_needs_the_estimate_is_within_half(tmp_path):
    # one GPU that holds one of the two: the job's model loads once the other is done
    coord, _ = coordinator(tmp_path, [manifest("m", 3000), manifest("n", 3000)],
                           backend_kwargs={"load_s": 0.5})
    async with started_client(coord) as client:
        await _learn(client, "n")  # n's rate and load time learned ...
        await _learn(client, "m")  # ... then m's, which took the GPU from it
        ahead = [await _start(client, coord, "m", tokens) for tokens in (250, 200)]
        estimated, waited = await _estimate_and_wait(client, chat("n", 10))
        await asyncio.gather(*ahead)
    # 4.5 s of m's work, less what ran before the job came (more on a loaded box), then n's
    # load of 0.5 s: a wait a count of the requests ahead (0.04 s said before) cannot meet
    assert waited > 2.0
    print(f"estimated {estimated:.2f} s, waited {waited:.2f} s")
    assert abs(estimated - waited) <= 0.5 * waited, (estimated, waited)


@pytest.mark.parametrize(("endpoint", "body", "work"), [
    ("/v1/chat/completions", {"max_tokens": 64}, 64),
    ("/v1/chat/completions", {"max_completion_tokens": 32}, 32),
    ("/v1/responses", {"max_output_tokens": 16}, 16),
    ("/completion", {"n_predict": 8}, 8),
    ("/v1/images/generations", {"steps": 20, "n": 2}, 40),
    ("/v1/images/generations", {"n": 2}, None),
    ("/v1/chat/completions", {}, None),
    ("/v1/chat/completions", {"max_tokens": True}, None),
    ("/v1/embeddings", {"input": "x"}, None),
])
def test_a_requests_length_as_asked(endpoint, body, work):
    assert asked_work(endpoint, body) == work
