"""Jobs through the API (model_boss/api/jobs.py, services/jobs.py, jobs/runner.py): a job is
checked as its live request would be before it is accepted, and a chat job reports the
tokens it has generated while it runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from model_boss.backends.base import UpstreamResponse

from .fakes import FakeBackend, coordinator, manifest, started_client

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float = 5.0) -> Any:
    """``check()``'s first true answer, polled; an AssertionError naming the last one."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    seen = None
    while asyncio.get_running_loop().time() < deadline:
        seen = await check()
        if seen:
            return seen
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout_s}s; last seen: {seen!r}")


async def submit(client: httpx.AsyncClient, body: dict[str, Any],
                 endpoint: str = CHAT) -> httpx.Response:
    return await client.post("/api/v1/jobs", json={"endpoint": endpoint, "body": body})


async def seen_when(client: httpx.AsyncClient, job_id: str, status: str,
                    progress: dict | None = None) -> dict:
    """The job once it has ``status`` (and, when given, that ``progress``)."""
    async def check() -> dict | None:
        seen = (await client.get(f"/api/v1/jobs/{job_id}")).json()
        if seen["status"] == status and progress in (None, seen["progress"]):
            return seen
        return None

    return await until(check)


@pytest.mark.parametrize("body", [
    {"model": "nope", "messages": HI},  # an unknown model
    {"model": "task:nope", "messages": HI},  # an unknown task
    {"model": "m", "x_task": "nope", "messages": HI},
    {"model": "m", "n": 2, "messages": HI},  # more choices than the model serves
], ids=["model", "task", "x_task", "n"])
async def test_a_job_is_refused_at_once_with_its_live_requests_error(tmp_path, body):
    coord, log = coordinator(tmp_path, [manifest("m")])
    async with started_client(coord) as client:
        live = await client.post(CHAT, json=body)
        refused = await submit(client, body)
        assert live.status_code in (400, 404)
        assert (refused.status_code, refused.json()) == (live.status_code, live.json())
        assert (await client.get("/api/v1/jobs")).json()["jobs"] == []
    assert not [entry for entry in log if entry[0] == "start"]  # nothing was loaded


@pytest.mark.parametrize("job, param", [
    ({"endpoint": CHAT, "body": {"model": "m"}}, "messages"),
    ({"endpoint": CHAT, "body": {"model": "m", "messages": HI, "temperature": 9}},
     "temperature"),
    ({"endpoint": "/v1/responses", "body": {"model": "m", "input": "hi"}}, "endpoint"),
    ({"endpoint": "/v1/audio/transcriptions", "body": {"model": "m"}}, "endpoint"),
], ids=["missing", "out-of-range", "responses", "upload"])
async def test_a_body_or_endpoint_a_job_cannot_take_is_a_400_naming_it(tmp_path, job, param):
    coord, _ = coordinator(tmp_path, [manifest("m")])
    async with started_client(coord) as client:
        refused = await client.post("/api/v1/jobs", json=job)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param


async def test_a_streamed_job_is_refused(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("m")])
    async with started_client(coord) as client:
        refused = await submit(client, {"model": "m", "stream": True, "messages": HI})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "stream" and "whole" in error["message"]
        # stream: false is what a job does anyway
        accepted = await submit(client, {"model": "m", "stream": False, "messages": HI})
        assert accepted.status_code == 202, accepted.text


def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7,
            "model": "m", "choices": choices, **extra}
    return b"data: " + orjson.dumps(data) + b"\n\n"


class TokenBackend(FakeBackend):
    """Streams a chat answer one token at a time, each when the test lets it pass (as
    llama.cpp's server does, with the usage last when asked); records what it was asked."""

    def __init__(self, entry, settings, log: list, tokens: asyncio.Queue) -> None:
        super().__init__(entry, settings, log)
        self.tokens = tokens

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        self.log.append(("asked", endpoint, stream, body.get("stream_options")))
        return UpstreamResponse(200, {"content-type": "text/event-stream"},
                                stream=self._tokens())

    async def _tokens(self) -> AsyncIterator[bytes]:
        yield chunk([{"index": 0, "delta": {"role": "assistant", "content": None},
                      "finish_reason": None}])
        count = 0
        while (token := await self.tokens.get()) is not None:
            count += 1
            yield chunk([{"index": 0, "delta": {"content": token}, "finish_reason": None}])
        yield chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        yield chunk([], usage={"prompt_tokens": 3, "completion_tokens": count,
                               "total_tokens": 3 + count})
        yield b"data: [DONE]\n\n"


async def test_a_chat_job_reports_its_tokens_while_it_runs(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("m")])
    tokens: asyncio.Queue = asyncio.Queue()
    coord.pool.backend_factory = lambda entry, s: TokenBackend(entry, s, log, tokens)
    coord.jobs.runner.progress_interval_s = 0.01
    async with started_client(coord) as client:
        job = (await submit(client, {"model": "m", "max_tokens": 8, "messages": HI})).json()
        for token in ("Hel", "lo", " world"):
            await tokens.put(token)
        await seen_when(client, job["id"], "running", {"tokens": 3})
        await tokens.put("!")
        await seen_when(client, job["id"], "running", {"tokens": 4})
        await tokens.put(None)
        done = await seen_when(client, job["id"], "succeeded")
    # the whole answer a non-streamed request gets from a llama.cpp worker
    assert done["result"] == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m",
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": "Hello world!"}}]}
    assert done["progress"] == {"tokens": 4}
    assert ("asked", CHAT, True, {"include_usage": True}) in log


class WholeBackend(FakeBackend):
    """A server that answers whole although it was asked for a stream."""

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        return UpstreamResponse(200, {"content-type": "application/json"},
                                body=b'{"object": "chat.completion", "choices": []}')


async def test_a_chat_job_answered_whole_keeps_that_answer(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("m")])
    coord.pool.backend_factory = lambda entry, s: WholeBackend(entry, s, log)
    async with started_client(coord) as client:
        job = (await submit(client, {"model": "m", "messages": HI})).json()
        done = await seen_when(client, job["id"], "succeeded")
    assert done["result"] == {"object": "chat.completion", "choices": []}
    assert done["progress"] == {}


async def test_a_job_finishes_when_its_progress_follower_loses_its_cancel(tmp_path,
                                                                          monkeypatch):
    """A store client that swallows a cancel (the follower's progress write goes on) must not
    keep the job from finishing: the follower stops at its next turn, and one that has not
    ended in time is left behind."""
    from model_boss.jobs import runner as runner_module

    monkeypatch.setattr(runner_module, "FOLLOWER_END_S", 0.5)
    coord, log = coordinator(tmp_path, [manifest("m")])
    tokens: asyncio.Queue = asyncio.Queue()
    coord.pool.backend_factory = lambda entry, s: TokenBackend(entry, s, log, tokens)
    coord.jobs.runner.progress_interval_s = 0.01
    update = coord.jobs.update
    writing = asyncio.Event()
    lost: list[str] = []

    async def loses_a_cancel(job, **changes):
        if "progress" in changes and not lost:
            writing.set()
            try:
                await asyncio.sleep(3600)  # a write that hangs ...
            except asyncio.CancelledError:
                lost.append(job.id)  # ... and a client that swallows the cancel
        await update(job, **changes)

    monkeypatch.setattr(coord.jobs, "update", loses_a_cancel)
    async with started_client(coord) as client:
        job = (await submit(client, {"model": "m", "max_tokens": 8, "messages": HI})).json()
        await tokens.put("Hel")
        await asyncio.wait_for(writing.wait(), 5)
        await tokens.put(None)
        done = await seen_when(client, job["id"], "succeeded")
    assert lost == [job["id"]]
    assert done["result"]["usage"]["completion_tokens"] == 1
