"""Embedding and rerank requests that reach one worker together go to it as one exchange: the
coordinator's gathering (when a gathering is sent, who is in it, what each caller gets back)
and the transformers worker's ``POST /batch`` (each part answered as it would be alone, all
of them in one batch of the model)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from model_boss.backends.base import UpstreamResponse
from model_boss.backends.gathering import GATHERED, Gathering
from model_boss.errors import WorkerCrashed
from tests.lazy_modules import lazy
from workers.transformers.app import create_app
from workers.transformers.engine import Engine
from workers.transformers.options import WorkerOptions

np = lazy("numpy")


class _Exchanges:
    """A worker stand-in: records each exchange and answers each body with its own text."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.sent: list[tuple[str, list[Any]]] = []
        self.fail = fail

    async def __call__(self, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
        self.sent.append((path, [body["input"] for body in bodies]))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return [UpstreamResponse(200, body=orjson.dumps(body["input"])) for body in bodies]


async def _embed(gathering: Gathering, text: Any, path: str = "/v1/embeddings") -> Any:
    answer = await gathering.submit(path, {"input": text}, GATHERED[path]({"input": text,
                                                                         "documents": text}))
    return orjson.loads(answer.body)


async def test_requests_that_come_together_go_as_one_exchange_each_with_its_answer():
    send = _Exchanges()
    gathering = Gathering(send, batch_size=32, quiet_s=0.05, longest_s=1.0)
    answers = await asyncio.gather(*(_embed(gathering, f"text {i}") for i in range(5)))
    assert answers == [f"text {i}" for i in range(5)]
    assert send.sent == [("/v1/embeddings", [f"text {i}" for i in range(5)])]


async def test_a_full_gathering_goes_at_once_without_waiting_for_quiet():
    send = _Exchanges()
    gathering = Gathering(send, batch_size=4, quiet_s=30.0, longest_s=30.0)
    # items count, not requests: a list of three and one more fill it
    answers = await asyncio.wait_for(asyncio.gather(
        _embed(gathering, ["a", "b", "c"]), _embed(gathering, "d")), timeout=5)
    assert answers == [["a", "b", "c"], "d"]
    assert send.sent == [("/v1/embeddings", [["a", "b", "c"], "d"])]


async def test_requests_that_keep_coming_are_sent_by_the_longest_wait():
    """One every 20 ms with a quiet wait of 100 ms never goes quiet: the longest wait (250 ms
    after a gathering's first request) sends it. Without that cap it would be one exchange."""
    send = _Exchanges()
    gathering = Gathering(send, batch_size=1000, quiet_s=0.1, longest_s=0.25)
    tasks = []
    for i in range(50):  # a second of requests
        tasks.append(asyncio.create_task(_embed(gathering, i)))
        await asyncio.sleep(0.02)
    assert await asyncio.gather(*tasks) == list(range(50))
    assert len(send.sent) >= 3, send.sent
    assert [text for _, texts in send.sent for text in texts] == list(range(50))


async def test_a_pause_longer_than_the_quiet_wait_ends_a_gathering():
    send = _Exchanges()
    gathering = Gathering(send, batch_size=1000, quiet_s=0.05, longest_s=10.0)
    first = asyncio.gather(*(_embed(gathering, i) for i in range(3)))
    await asyncio.sleep(0.5)
    assert await first == [0, 1, 2] and len(send.sent) == 1
    assert await _embed(gathering, 3) == 3
    assert send.sent == [("/v1/embeddings", [0, 1, 2]), ("/v1/embeddings", [3])]


async def test_routes_are_gathered_apart():
    send = _Exchanges()
    gathering = Gathering(send, batch_size=32, quiet_s=0.05, longest_s=1.0)
    await asyncio.gather(_embed(gathering, "e1"), _embed(gathering, ["d"], "/v1/rerank"),
                         _embed(gathering, "e2"))
    assert sorted(send.sent) == [("/v1/embeddings", ["e1", "e2"]), ("/v1/rerank", [["d"]])]


async def test_a_caller_gone_before_the_exchange_is_left_out_of_it():
    send = _Exchanges()
    gathering = Gathering(send, batch_size=32, quiet_s=0.1, longest_s=1.0)
    kept = asyncio.create_task(_embed(gathering, "kept"))
    gone = asyncio.create_task(_embed(gathering, "gone"))
    await asyncio.sleep(0.01)
    gone.cancel()
    assert await kept == "kept"
    assert send.sent == [("/v1/embeddings", ["kept"])]
    # a gathering whose every caller left is never sent
    alone = asyncio.create_task(_embed(gathering, "alone"))
    await asyncio.sleep(0.01)
    alone.cancel()
    await asyncio.sleep(0.3)
    assert send.sent == [("/v1/embeddings", ["kept"])]


async def test_an_exchange_that_fails_fails_each_caller_with_its_own_error():
    send = _Exchanges(fail=WorkerCrashed("the worker of 'embed' stopped"))
    gathering = Gathering(send, batch_size=32, quiet_s=0.01, longest_s=1.0)
    errors = await asyncio.gather(*(_embed(gathering, i) for i in range(3)),
                                  return_exceptions=True)
    assert all(isinstance(e, WorkerCrashed) and "stopped" in e.message for e in errors)
    assert len({id(e) for e in errors}) == 3  # each raised in its own request, not shared


class _Embedder(Engine):
    """An embedding engine without a model: a text's vector is [its length, 1, 2, 3]."""

    def __init__(self) -> None:
        super().__init__(WorkerOptions(model="embedder", task="embedding", port=0,
                                       max_batch_wait_ms=2000))
        self.state, self.dimensions = "ready", 4
        self.batches: list[list[str]] = []

    def load(self) -> None:
        pass

    def embed(self, texts: list[str]) -> list[tuple[Any, int]]:
        self.batches.append(list(texts))
        return [(np.array([len(t), 1, 2, 3], dtype=np.float32), 2) for t in texts]


async def test_the_workers_batch_route_answers_each_part_as_alone_in_one_model_batch():
    engine = _Embedder()
    app = create_app(engine)
    parts = [{"input": "one", "request_id": "a"},
             {"input": "", "request_id": "b"},  # refused alone: its own 400
             {"input": ["three", "four!"], "dimensions": 2, "request_id": "c"},
             {"input": "x", "encoding_format": "hex", "request_id": "d"}]
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=transport, base_url="http://w") as client:
        # the model's wait is 2 s: parts that come gathered do not wait for more
        started = asyncio.get_running_loop().time()
        batch = await client.post("/batch", json={"path": "/v1/embeddings", "parts": parts})
        took = asyncio.get_running_loop().time() - started
        alone = await asyncio.gather(*(client.post("/v1/embeddings", json=part)
                                       for part in parts[1:]))
        unknown = await client.post("/batch", json={"path": "/v1/audio/speech",
                                                     "parts": [{"input": "x"}]})
    assert batch.status_code == 200 and took < 1.0, took
    head, _, rest = batch.content.partition(b"\n")
    frame = orjson.loads(head)
    assert [status for status, _ in frame] == [200, 400, 200, 400]
    bodies, start = [], 0
    for _, length in frame:
        bodies.append(orjson.loads(rest[start:start + length]))
        start += length
    assert start == len(rest)
    assert bodies[0]["data"][0]["embedding"] == [3, 1, 2, 3]
    assert [v for d in bodies[2]["data"] for v in d["embedding"]] == pytest.approx(
        [0.98058, 0.19612] * 2, abs=1e-4)  # shortened to unit length
    for part, answer in zip(bodies[1:], alone, strict=True):  # as each is answered alone
        if "error" in part:
            assert answer.status_code == 400 and answer.json() == part
        else:
            assert [d["embedding"] for d in answer.json()["data"]] == \
                [d["embedding"] for d in part["data"]]
    assert engine.batches[0] == ["one", "three", "four!"]  # one model batch for the parts
    assert unknown.status_code == 400 and "path" in unknown.json()["error"]["message"]
