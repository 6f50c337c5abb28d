"""The transformers worker under the coordinator: a tiny random-weight embedder and reranker
(built with save_pretrained), served through the official clients, batched, swapped through
the CPU tier on one small declared GPU, and bad input answered with 4xx envelopes."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import struct

import httpx
import ollama
import openai
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for, worker_health
from tests.transformers_fixtures import build_embedder, build_reranker, shared

pytestmark = pytest.mark.slow

pytest.importorskip("sentence_transformers", reason="the 'transformers' extra")


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    embedder = shared(tmp_path_factory, "embedder", build_embedder)
    reranker = shared(tmp_path_factory, "reranker", build_reranker)
    manifests = [
        {"id": "embed", "backend": "transformers", "category": "embedding",
         "path": str(embedder), "vram_mb": 1000, "max_batch_wait_ms": 20},
        {"id": "rerank", "backend": "transformers", "category": "rerank",
         "path": str(reranker), "vram_mb": 1000},
        llama_manifest("smol", demo_gguf, vram_mb=1000),
    ]
    # room for one model at a time: every switch goes through the CPU-RAM tier
    srv = ServerProcess(tmp_path_factory.mktemp("transformers"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 1600}],
                         "vram_margin_mb": 100}, manifests)
    srv.start()
    yield srv
    srv.stop()


def slot(server: ServerProcess, model: str) -> dict:
    return next(s for s in server.status()["slots"] if s["model"] == model)


def test_the_openai_client_embeds(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    one = client.embeddings.create(model="embed", input="the cat sat on the mat")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 32
    assert one.usage.prompt_tokens > 2 and one.model == "embed"
    many = client.embeddings.create(model="embed", input=["a cat", "a dog", "paris"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.data[0].embedding != many.data[1].embedding
    short = client.embeddings.create(model="embed", input="a cat", dimensions=8)
    vector = short.data[0].embedding
    assert len(vector) == 8 and abs(sum(x * x for x in vector) - 1) < 1e-4
    raw = httpx.post(server.url + "/v1/embeddings", timeout=60, json={
        "model": "embed", "input": "a cat", "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert len(packed) == 32 * 4
    floats = struct.unpack("<32f", packed)
    assert floats == pytest.approx(many.data[0].embedding, abs=1e-5)


def test_ollamas_client_embeds(server):
    client = ollama.Client(host=server.url)
    answer = client.embed(model="embed", input=["hello world", "the sun rose"])
    assert len(answer.embeddings) == 2 and len(answer.embeddings[0]) == 32


def test_rerank_orders_documents_by_score(server):
    docs = ["paris is the capital of france", {"text": "the cat sat on the mat"},
            "the river is blue", "a big red dog"]
    answer = httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "rerank", "query": "what is the capital of france", "documents": docs})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert body["model"] == "rerank" and body["usage"]["total_tokens"] > 0
    top = httpx.post(server.url + "/rerank", timeout=60, json={
        "model": "rerank", "query": "capital", "documents": docs, "top_n": 2,
        "return_documents": True}).json()["results"]
    assert len(top) == 2
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    assert all(r["document"]["text"] == texts[r["index"]] for r in top)


def test_switches_go_through_the_cpu_tier(server):
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    pid = slot(server, "embed")["pid"]
    httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "rerank", "query": "q", "documents": ["d"]}).raise_for_status()
    parked = slot(server, "embed")
    assert parked["state"] == "offloaded" and parked["tier"] == "cpu" and parked["lease"] is None
    assert worker_health(parked)["state"] == "offloaded"
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    back = slot(server, "embed")
    assert back["state"] == "ready" and back["pid"] == pid  # onloaded, not loaded from disk
    assert slot(server, "rerank")["tier"] == "cpu"


def test_concurrent_single_sentences_are_batched(server):
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(
                client.post(server.url + "/v1/embeddings",
                            json={"model": "embed", "input": f"sentence {i}"})
                for i in range(32)))

    answers = asyncio.run(burst())
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
    health = worker_health(slot(server, "embed"))
    assert health["largest_batch"] > 1, health


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": "not a list"}, "documents"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"model": "rerank", "query": "", "documents": ["d"]}, "query"),
    ("/v1/rerank", {"model": "embed", "query": "q", "documents": ["d"]}, "/v1/embeddings"),
    ("/v1/embeddings", {"model": "rerank", "input": "x"}, "/v1/rerank"),
    ("/v1/embeddings", {"model": "embed", "input": [[1, 2, 3]]}, "token arrays"),
    ("/v1/embeddings", {"model": "embed", "input": ["ok", ""]}, "empty"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "dimensions": 4096}, "dimensions"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": "hex"},
     "encoding_format"),
    ("/v1/chat/completions", {"model": "embed", "messages": [{"role": "user",
                                                              "content": "hi"}]}, "embed"),
])
def test_bad_input_is_a_4xx_in_the_openai_envelope(server, path, body, words):
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]
    assert words in error["message"] and set(error) >= {"message", "type", "code"}, error
    wait_for(lambda: all(s["state"] in ("idle", "ready", "offloaded")
                         for s in server.status()["slots"]), timeout=30)


def test_unknown_model_and_a_killed_worker(server):
    missing = httpx.post(server.url + "/v1/rerank", timeout=30, json={
        "model": "nope", "query": "q", "documents": ["d"]})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
               timeout=60).raise_for_status()
    pid = slot(server, "embed")["pid"]
    os.kill(pid, signal.SIGKILL)
    # the crash is noticed (the slot leaves READY, its lease goes) and the next request
    # loads a new worker
    wait_for(lambda: slot(server, "embed")["state"] != "ready", timeout=15,
             what=lambda: slot(server, "embed"))
    again = httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "x"},
                       timeout=60)
    assert again.status_code == 200, again.text
    assert slot(server, "embed")["pid"] not in (None, pid)
