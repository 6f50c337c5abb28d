"""Anthropic's Messages API, spoken by the official ``anthropic`` client (sync, async,
``messages.stream``, ``count_tokens``, its error classes) and ``langchain-anthropic``: on the
demo model (llama.cpp's server answers ``/v1/messages`` itself), on an OpenAI-compatible
remote (translated to chat completions and back) and on a remote that speaks Anthropic's API
(``api: anthropic``, passed through), with the API key the SDK sends (``x-api-key``)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for
from tests.e2e.test_cloud_backend import KEY, cloud, start_upstream
from tests.lazy_modules import lazy

if importlib.util.find_spec("anthropic") is None:
    pytest.skip("needs the 'clients' extra: pip install -e '.[clients]'",
                allow_module_level=True)
anthropic = lazy("anthropic")

pytestmark = pytest.mark.slow

USER_KEY = "user-key-1"
HI = [{"role": "user", "content": "Say hello."}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, int]]:
    started = {"good": start_upstream("--require-key", KEY, "--chunks", "4"),
               "breaking": start_upstream("--require-key", KEY, "--chunks", "6",
                                          "--break-after", "2")}
    try:
        yield {name: port for name, (_, port) in started.items()}
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(10)


@pytest.fixture(scope="module")
def server(upstreams: dict[str, int], demo_gguf: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    manifests = [
        llama_manifest("smol", demo_gguf, aliases=["smol-alias"]),
        cloud("openai-remote", upstreams["good"]),
        cloud("openai-breaks", upstreams["breaking"]),
        cloud("anthropic-remote", upstreams["good"], api="anthropic"),
    ]
    process = ServerProcess(tmp_path_factory.mktemp("anthropic"),
                            {"api_key": USER_KEY, "max_body_bytes": 64 * 1024,
                             "gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
                            manifests, env={"FAKE_UPSTREAM_KEY": KEY},
                            headers={"x-api-key": USER_KEY})
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=USER_KEY, max_retries=0)


@pytest.fixture(scope="module")
def aclient(server: ServerProcess) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.url, api_key=USER_KEY, max_retries=0)


def requests_logged(server: ServerProcess) -> list[dict]:
    path = server.workdir / "state" / "requests.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] \
        if path.exists() else []


# --- the demo model: llama.cpp's own /v1/messages ------------------------------------------

def test_create_on_the_demo_model(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(model="smol", max_tokens=8, messages=HI,
                                                   system="Be brief.",
                                                   extra_body={"temperature": 0, "top_k": 1})
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "smol"
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    assert raw.headers["x-model-boss-model"] == "smol"


def test_stream_on_the_demo_model(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="smol-alias", max_tokens=8, messages=HI) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) >= 2 and "".join(pieces) == final.content[0].text
    assert final.stop_reason in ("max_tokens", "end_turn")


def test_stream_events_follow_the_protocol(server: ServerProcess) -> None:
    """message_start, then a ping, blocks, message_delta with the stop reason, message_stop."""
    body = {"model": "smol", "max_tokens": 4, "stream": True, "messages": HI}
    with server.client() as http, http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        kinds = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[2] == "content_block_start" and "content_block_delta" in kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


async def test_async_create_and_stream(aclient: anthropic.AsyncAnthropic) -> None:
    message = await aclient.messages.create(model="smol", max_tokens=6, messages=HI)
    assert message.content[0].text.strip()
    async with aclient.messages.stream(model="smol", max_tokens=6, messages=HI) as stream:
        text = "".join([piece async for piece in stream.text_stream])
    assert text.strip()


def test_count_tokens_on_the_demo_model(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(model="smol", messages=HI)
    longer = client.messages.count_tokens(
        model="smol",
        messages=[{"role": "user", "content": "Say hello to everyone in the room."}])
    assert 0 < short.input_tokens < longer.input_tokens, (short, longer)


def test_bearer_key_and_headers_are_taken(server: ServerProcess) -> None:
    body = {"model": "smol", "max_tokens": 2, "messages": HI}
    answer = httpx.post(server.url + "/v1/messages", json=body, timeout=60, headers={
        "authorization": f"Bearer {USER_KEY}", "anthropic-version": "2023-06-01",
        "anthropic-beta": "tools-2024-04-04"})
    assert answer.status_code == 200, answer.text


def test_priority_and_client_reach_the_queue(client: anthropic.Anthropic,
                                             server: ServerProcess) -> None:
    """x-priority is the queue's, as on every route; with a key, metadata.user_id (the client
    id) labels the end user under the key, which stays the queue's client."""
    client.messages.create(model="smol", max_tokens=2, messages=HI,
                           metadata={"user_id": "agent-7"},
                           extra_headers={"x-priority": "3"})
    entry = wait_for(lambda: next(iter(server.client().get(
        "/api/v1/requests", params={"client": "agent-7"},
        headers={"authorization": f"Bearer {USER_KEY}"}).json()["requests"]), None),
        timeout=10)
    assert entry["end_user"] == "agent-7"
    assert entry["priority"] == 3 and entry["model"] == "smol"
    assert entry["client_id"] == "default"  # the config file's shared api_key


# --- errors in Anthropic's envelope --------------------------------------------------------

def test_missing_max_tokens_is_a_400_naming_it(server: ServerProcess) -> None:
    answer = server.client().post("/v1/messages", json={"model": "smol", "messages": HI})
    assert answer.status_code == 400
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


@pytest.mark.parametrize("body, field", [
    ({"model": "smol", "max_tokens": 5, "messages": "hello"}, "messages"),
    ({"model": "smol", "max_tokens": "5", "messages": HI}, "max_tokens"),
    ({"model": "smol", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
     "role"),
    ({"model": "smol", "max_tokens": 5, "messages": HI, "temperature": 1.5}, "temperature"),
    ({"model": "smol", "max_tokens": 5, "messages": HI,
      "tool_choice": {"type": "tool"}}, "tool_choice"),
])
def test_malformed_bodies_are_400s(server: ServerProcess, body: dict, field: str) -> None:
    answer = server.client().post("/v1/messages", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert field in answer.json()["error"]["message"]


def test_sdk_error_classes(server: ServerProcess, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=5, messages=HI)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="smol", max_tokens=0, messages=HI)
    stranger = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.create(model="smol", max_tokens=5, messages=HI)
    assert refused.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.APIStatusError) as too_big:
        client.messages.create(model="smol", max_tokens=5,
                               messages=[{"role": "user", "content": "x" * 100_000}])
    assert too_big.value.status_code == 413
    assert too_big.value.body["error"]["type"] == "request_too_large"


def test_an_image_for_a_model_without_vision_is_a_400(client: anthropic.Anthropic) -> None:
    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAA"
           "AABJRU5ErkJggg==")
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="smol", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": png}},
            {"type": "text", "text": "What is this?"}]}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "/" not in refused.value.body["error"]["message"].replace("N/A", "")


# --- an OpenAI-compatible remote: translated ---------------------------------------------

def test_translated_create_and_stream(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="openai-remote", max_tokens=20,
                                     messages=[{"role": "user", "content": [
                                         {"type": "text", "text": "ping"}]}])
    assert message.content[0].text == "echo: ping"
    assert message.stop_reason == "end_turn" and message.model == "openai-remote"
    with client.messages.stream(model="openai-remote", max_tokens=20, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "part0 part1 part2 part3 "
    assert final.usage.output_tokens == 4


def test_translated_tool_use(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="openai-remote", max_tokens=20, messages=HI,
                                     tools=[WEATHER], tool_choice={"type": "any"})
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "Paris"}
    # the tool's result goes back as a tool_result block
    follow = client.messages.create(model="openai-remote", max_tokens=20, messages=[
        *HI, {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "sunny"},
                                     {"type": "text", "text": "and now?"}]}])
    assert follow.content[0].text == "echo: and now?"
    with client.messages.stream(model="openai-remote", max_tokens=20, messages=HI,
                                tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "Paris"}


def test_translated_count_tokens(client: anthropic.Anthropic) -> None:
    assert client.messages.count_tokens(model="openai-remote", messages=HI).input_tokens == 1


def test_a_stream_that_breaks_ends_with_an_error_event(server: ServerProcess) -> None:
    body = {"model": "openai-breaks", "max_tokens": 20, "stream": True, "messages": HI}
    with server.client() as http, http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    kinds = [line[7:] for line in lines if line.startswith("event: ")]
    assert kinds[-1] == "error", lines
    error = orjson.loads(next(line[6:] for line in reversed(lines) if line.startswith("data: ")))
    assert error["type"] == "error" and error["error"]["message"]
    assert "127.0.0.1" not in error["error"]["message"]


def test_sdk_raises_on_the_error_event(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model="openai-breaks", max_tokens=20,
                                    messages=HI) as stream:
            for _ in stream.text_stream:
                pass


# --- a remote that speaks Anthropic's API: passed through ---------------------------------

def test_anthropic_remote_passthrough(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="anthropic-remote", max_tokens=20, messages=HI)
    assert message.content[0].text == "echo: Say hello." and message.model == "anthropic-remote"
    with client.messages.stream(model="anthropic-remote", max_tokens=20,
                                messages=HI) as stream:
        assert "".join(stream.text_stream) == "part0 part1 part2 part3 "
    assert client.messages.count_tokens(model="anthropic-remote", messages=HI).input_tokens == 7


def test_anthropic_remote_refuses_openai_routes(server: ServerProcess) -> None:
    answer = server.client().post("/v1/chat/completions",
                                  json={"model": "anthropic-remote", "messages": HI})
    assert answer.status_code == 400
    assert "/v1/messages" in answer.json()["error"]["message"]


# --- langchain-anthropic -------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("langchain_anthropic") is None,
                    reason="needs langchain-anthropic (the 'clients' extra)")
def test_langchain_anthropic(server: ServerProcess) -> None:
    from langchain_anthropic import ChatAnthropic

    model = ChatAnthropic(model="smol", base_url=server.url, api_key=USER_KEY, max_tokens=8,
                          max_retries=0, timeout=60)
    assert model.invoke("Say hello.").content
    started = time.monotonic()
    pieces = [chunk.content for chunk in model.stream("Say hello.")]
    assert pieces and time.monotonic() - started < 60
