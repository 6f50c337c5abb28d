"""A worker that runs out of GPU memory while it loads: the load claims a quarter more (learned,
so the next load claims it too), makes room for it (evicting what no longer fits beside it),
and goes again once; an ``oom_retry`` event and a timeline mark say so. Any other failure, or
a second one, fails the load as before, with nothing left behind."""

from __future__ import annotations

import pytest

from .fakes import coordinator, manifest, started_client

OOM = "ggml_backend_cuda_buffer_type_alloc_buffer: cudaMalloc failed: out of memory"


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def of(events: list[dict], *kinds: str) -> list[tuple]:
    return [(e["type"], e.get("model")) for e in events if e["type"] in kinds]


async def test_an_out_of_memory_load_claims_more_and_goes_again(tmp_path):
    failures: list[BaseException] = []
    coord, log = coordinator(tmp_path, [manifest("a", 2000), manifest("b", 1500)],
                             backend_kwargs={"fail_starts": failures})
    async with started_client(coord) as client:
        assert (await client.post("/v1/chat/completions", json=chat("b"))).status_code == 200
        failures.append(RuntimeError(OOM))  # a's first start runs out of memory
        answer = await client.post("/v1/chat/completions", json=chat("a"))
        assert answer.status_code == 200, answer.text
        events = (await client.get("/api/v1/events?stream=false")).json()["events"]
        status = (await client.get("/api/v1/status")).json()
        await coord.history.sample()
        marks = (await client.get("/api/v1/history")).json()["marks"]
    retry = next(e for e in events if e["type"] == "oom_retry")
    assert (retry["model"], retry["vram_mb"], retry["to_mb"]) == ("a", 2000, 2500)
    assert "out of memory" in retry["error"]
    # 1,500 + 2,000 fitted; 1,500 + 2,500 does not: b is evicted for the larger claim
    assert of(events, "loaded", "load_failed", "oom_retry", "evicted")[-4:] == [
        ("load_failed", "a"), ("oom_retry", "a"), ("evicted", "b"), ("loaded", "a")]
    assert [s["model"] for s in status["slots"] if s["state"] == "ready"] == ["a"]
    assert status["gpus"][0]["leased_mb"] == 2500
    assert coord.pool.learned.get("a").vram_mb == 2500  # the next load claims it from the start
    assert [(m["type"], m["model"]) for m in marks if m["type"] in ("oom_retry", "evict")] == [
        ("oom_retry", "a"), ("evict", "b")]
    assert "2500 MB" in next(m for m in marks if m["type"] == "oom_retry")["reason"]
    assert log.count(("start", "a")) == 2


@pytest.mark.parametrize(("failures", "starts"), [
    ([RuntimeError("bad magic in the model file")], 1),  # not memory: no retry
    ([RuntimeError(OOM), RuntimeError(OOM)], 2),  # out of memory twice: one retry only
])
async def test_other_failures_and_a_second_oom_fail_the_load(tmp_path, failures, starts):
    coord, log = coordinator(tmp_path, [manifest("a", 2000)],
                             backend_kwargs={"fail_starts": failures})
    async with started_client(coord) as client:
        answer = await client.post("/v1/chat/completions", json=chat("a"))
        status = (await client.get("/api/v1/status")).json()
        events = (await client.get("/api/v1/events?stream=false")).json()["events"]
    assert 500 <= answer.status_code < 600 and "error" in answer.json(), answer.text
    assert log.count(("start", "a")) == starts
    assert sum(e["type"] == "oom_retry" for e in events) == starts - 1
    assert status["leases"] == [] and status["gpus"][0]["leased_mb"] == 0
    assert all(s["state"] == "idle" for s in status["slots"])
