"""The Responses API's dialect (services/responses/dialect.py): which call a worker gets,
whole answers gathered from the told stream, the error event that ends a failed stream;
prompt_cache_key's slot choice (services/responses/affinity.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from model_boss.backends.base import UpstreamResponse
from model_boss.errors import ModelBossError, UpstreamError
from model_boss.services.responses import DIALECT, SlotAffinity, told

RECORDED = Path(__file__).parent / "llama_responses"


class Llama:
    """A llama.cpp worker as the dialect sees one."""

    llama_responses = True

    def __init__(self, parallel: int) -> None:
        self.manifest = SimpleNamespace(concurrency=parallel)


def llama(parallel: int = 1) -> Any:
    return Llama(parallel)


CLOUD = SimpleNamespace(manifest=SimpleNamespace(concurrency=256))


@pytest.mark.parametrize(("backend", "body", "sent", "streams", "gathers"), [
    # a worker that is not llama.cpp's server: the request as it came
    (CLOUD, {"input": "x", "stream": True}, {"input": "x", "stream": True}, False, False),
    (CLOUD, {"input": "x", "prompt_cache_key": "k"}, {"input": "x", "prompt_cache_key": "k"},
     False, False),
    # llama.cpp: a stream is told on the way back
    (llama(), {"input": "x", "stream": True}, {"input": "x", "stream": True}, True, False),
    # a whole answer is asked as a stream and gathered
    (llama(), {"input": "x"}, {"input": "x", "stream": True}, False, True),
    # a key asks for the prompt cache; one slot: nothing to choose
    (llama(), {"input": "x", "prompt_cache_key": "k", "stream": True},
     {"input": "x", "prompt_cache_key": "k", "cache_prompt": True, "stream": True}, True,
     False),
    # two slots: the key's slot named
    (llama(2), {"input": "x", "prompt_cache_key": "k", "stream": True},
     {"input": "x", "prompt_cache_key": "k", "cache_prompt": True, "id_slot": 0,
      "stream": True}, True, False),
    # the client's own id_slot and cache_prompt win
    (llama(2), {"input": "x", "prompt_cache_key": "k", "id_slot": 1, "cache_prompt": False},
     {"input": "x", "prompt_cache_key": "k", "id_slot": 1, "cache_prompt": False,
      "stream": True}, False, True),
])
def test_the_call_a_worker_gets(backend, body, sent, streams, gathers) -> None:
    call = DIALECT.call(backend, "m", "/v1/responses", dict(body))
    assert (call.endpoint, call.body) == ("/v1/responses", sent)
    assert (call.chunks is not None, call.gather is not None) == (streams, gathers)
    if call.settled is not None:
        call.settled()


def test_a_key_goes_back_to_its_slot_once_it_is_free() -> None:
    backend = llama(2)

    def slot(key: str) -> Any:
        call = DIALECT.call(backend, "m", "/v1/responses", {"input": "x", "stream": True,
                                                            "prompt_cache_key": key})
        return call.body.get("id_slot"), call.settled

    a, done_a = slot("a")
    b, done_b = slot("b")
    busy, done_busy = slot("a")  # a's slot is running a's first request: llama.cpp picks
    assert (a, b, busy) == (0, 1, None)
    for done in (done_a, done_b, done_busy):
        done()
    assert slot("b")[0] == 1 and slot("a")[0] == 0


@pytest.mark.parametrize(("steps", "slots"), [
    # (key or None, "take" / "give back <n>") → the slot each take gives
    ([("a", "take"), ("b", "take"), ("c", "take")], [0, 1, None]),
    # a key seen before goes back to its slot
    ([("a", "take"), ("a", "back 0"), ("b", "take"), ("b", "back 1"), ("a", "take")],
     [0, 1, 0]),
    # a new key takes the free slot no key holds, else the one given longest ago
    ([("a", "take"), ("a", "back 0"), ("b", "take"), ("b", "back 1"), ("c", "take")],
     [0, 1, 0]),
    ([("a", "take"), ("b", "take"), ("a", "back 0"), ("b", "back 1"), ("a", "take"),
      ("a", "back 0"), ("c", "take")], [0, 1, 0, 1]),
    # a request without a key runs where llama.cpp put it: no slot is named meanwhile
    ([(None, "take"), ("a", "take"), (None, "back None"), ("a", "back None"), ("a", "take")],
     [None, None, 0]),
])
def test_slot_affinity(steps, slots) -> None:
    affinity = SlotAffinity(2)
    given = []
    for key, step in steps:
        if step == "take":
            given.append(affinity.take(key))
        else:
            held = step.split()[1]
            affinity.give_back(None if held == "None" else int(held))
    assert given == slots


def test_one_slot_names_none_and_keys_are_forgotten_oldest_first() -> None:
    assert SlotAffinity(1).take("a") is None
    affinity = SlotAffinity(2, remembered=2)
    for key in "abc":
        affinity.give_back(affinity.take(key))
    assert affinity.slot_of("a") is None and affinity.slot_of("c") is not None


async def _chunks(raw: bytes, fail: Exception | None = None):
    yield raw
    if fail is not None:
        raise fail


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]


def test_a_whole_answer_is_the_told_stream_gathered() -> None:
    call = DIALECT.call(llama(), "smol", "/v1/responses", {"input": "x"})
    raw = (RECORDED / "reasoning_then_text.sse").read_bytes()
    upstream = UpstreamResponse(200, {"content-type": "text/event-stream"},
                                stream=_chunks(raw))
    whole = asyncio.run(call.gather(upstream))
    answer = orjson.loads(whole.body)
    assert answer["object"] == "response" and answer["id"].startswith("resp_")
    assert [(i["type"], i["id"][:3], i["status"]) for i in answer["output"]] == [
        ("reasoning", "rs_", "completed"), ("message", "msg", "completed")]
    assert answer["usage"]["output_tokens_details"] == {"reasoning_tokens": 8}
    assert answer["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert answer["completed_at"] >= answer["created_at"]


@pytest.mark.parametrize(("fail", "code", "words"), [
    (UpstreamError("worker for 'smol' answered 500: boom at /opt/x/y.py"), "upstream_error",
     "boom at y.py"),
    (RuntimeError("connection reset"), "stream_failed", "stream failed: connection reset"),
])
def test_a_stream_that_fails_ends_with_a_numbered_error_event(fail, code, words) -> None:
    raw = (RECORDED / "text.sse").read_bytes()[:1200]  # cut after a few events

    async def run() -> tuple[list[bytes], Exception]:
        sent: list[bytes] = []
        try:
            async for chunk in told(_chunks(raw, fail), "smol"):
                sent.append(chunk)
        except Exception as exc:
            return sent, exc
        raise AssertionError("the stream did not fail")

    sent, exc = asyncio.run(run())
    numbers = [e["sequence_number"] for e in _events(b"".join(sent))]
    end = DIALECT.stream_end(exc)
    assert end.startswith(b"event: error\n")
    (error,) = _events(end)
    assert error["sequence_number"] == numbers[-1] + 1
    assert (error["type"], error["code"]) == ("error", code) and words in error["message"]
    assert error["error"]["message"] == error["message"]  # what OpenAI's SDK raises


def test_a_failure_before_any_event_is_number_zero() -> None:
    (error,) = _events(DIALECT.stream_end(ModelBossError("no room", code="capacity")))
    assert error["sequence_number"] == 0 and error["code"] == "capacity"


def test_comments_pass_untouched() -> None:
    raw = b": loading smol\n\n" + (RECORDED / "text.sse").read_bytes()

    async def run() -> bytes:
        return b"".join([chunk async for chunk in told(_chunks(raw), "smol")])

    assert asyncio.run(run()).startswith(b": loading smol\n\nevent: response.created\n")


def test_a_drained_responses_stream_ends_with_the_numbered_error_event() -> None:
    from model_boss.api.middleware.drain import stream_end

    assert stream_end("/v1/responses") == DIALECT.stream_end == stream_end("/responses")
