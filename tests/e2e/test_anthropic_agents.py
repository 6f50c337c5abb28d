"""Claude Code's requests against a real coordinator: every body under tests/data/agents/
through the official ``anthropic`` client, whole and streamed, on the demo model (llama.cpp's
own ``/v1/messages``); a template that refuses mid-conversation system turns (served folded);
a repeated prefix read from llama.cpp's cache; a prompt too long and a context that fills, in
Anthropic's words; and, behind a slow stand-in remote, a stream that opens within a second
and pings at its interval through a long wait (the interval set short by
``MODEL_BOSS_ANTHROPIC_PING_S``, so seconds prove what Claude Code needs over minutes)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for
from tests.e2e.test_cloud_backend import KEY, cloud, start_upstream
from tests.lazy_modules import lazy

if importlib.util.find_spec("anthropic") is None:
    pytest.skip("needs the 'clients' extra: pip install -e '.[clients]'",
                allow_module_level=True)
anthropic = lazy("anthropic")

pytestmark = pytest.mark.slow

USER_KEY = "user-key-agents"
AGENTS = Path(__file__).resolve().parents[1] / "data" / "agents"
BODIES = sorted(AGENTS.glob("*.json"))
PING_S = 0.5
ANSWER_DELAY_MS = 3000  # the stand-in's wait before its answer begins (a long prefill)
CHUNK_DELAY_MS = 1300  # and between its chunks
BETAS = ("claude-code-20250219,interleaved-thinking-2025-05-14,"
         "context-management-2025-06-27,fine-grained-tool-streaming-2025-05-14")
# Gemma's rule: a template that raises on any turn out of user/assistant order
ALTERNATING = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = "
    "messages[0]['content'] + '\\n\\n' %}{% set rest = messages[1:] %}{% else %}"
    "{% set prefix = '' %}{% set rest = messages %}{% endif %}{% for message in rest %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
    "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (prefix if loop.first else '') + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def slow_remote() -> Iterator[int]:
    proc, port = start_upstream("--require-key", KEY, "--chunks", "2",
                                "--answer-delay-ms", str(ANSWER_DELAY_MS),
                                "--chunk-delay-ms", str(CHUNK_DELAY_MS))
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def server(slow_remote: int, demo_gguf: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("agents")
    template = workdir / "alternating.jinja"
    template.write_text(ALTERNATING)
    manifests = [
        llama_manifest("smol", demo_gguf, ctx_size=8192),  # Claude Code: ~4-8k
        llama_manifest("tiny", demo_gguf, ctx_size=256),
        llama_manifest("strict", demo_gguf, ctx_size=2048, chat_template=str(template)),
        cloud("slow-remote", slow_remote),
    ]
    process = ServerProcess(workdir, {"api_key": USER_KEY,
                                      "gpus": [{"index": 0, "name": "sim-8g",
                                                "vram_mb": 8192}]},
                            manifests, env={"FAKE_UPSTREAM_KEY": KEY,
                                            "MODEL_BOSS_ANTHROPIC_PING_S": str(PING_S)},
                            headers={"x-api-key": USER_KEY})
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=USER_KEY, max_retries=0,
                               timeout=600, default_headers={"anthropic-beta": BETAS})


def sdk_call(body: dict[str, Any], model: str, max_tokens: int) -> dict[str, Any]:
    """A recorded body as ``messages.create`` arguments: the fields the SDK types, the rest
    (``context_management``, ``output_config``, ...) as ``extra_body``, as Claude Code's own
    SDK sends them."""
    known = set(inspect.signature(anthropic.resources.messages.Messages.create).parameters)
    body = {**body, "model": model, "max_tokens": max_tokens}
    body.pop("stream", None)
    args = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    return {**args, "extra_body": extra} if extra else args


def requests_logged(server: ServerProcess) -> list[dict]:
    path = server.workdir / "state" / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] \
        if path.exists() else []


def total_input(usage: Any) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) \
        + (usage.cache_creation_input_tokens or 0)


# a captured first request is ~4,000 tokens: on two cores the suite shares its prefill took
# minutes (the whole answer; the stream after it reads the prompt from the cache)
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", BODIES, ids=lambda p: p.stem)
def test_a_claude_code_body_whole_and_streamed(client: anthropic.Anthropic,
                                               path: Path) -> None:
    body = json.loads(path.read_text())
    message = client.messages.create(**sdk_call(body, "smol", 8))
    assert message.id.startswith("msg_") and message.model == "smol"
    assert message.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use")
    assert total_input(message.usage) > 0 and 0 < message.usage.output_tokens <= 8
    for block in message.content:
        assert block.type != "tool_use" or block.id.startswith("toolu_")
    kinds = []
    with client.messages.stream(**sdk_call(body, "smol", 8)) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("message_start") == 1
    # (the input is counted too, except where llama.cpp leaves its message_start out: an
    # answer whose first token is part of a character, an emoji, Claude Code's favourite)
    assert final.id.startswith("msg_") and 0 < final.usage.output_tokens <= 8
    assert final.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use")


def test_a_repeated_prefix_is_read_from_the_cache(client: anthropic.Anthropic) -> None:
    body = json.loads((AGENTS / "claude_code_first_request.json").read_text())
    # greedy: a sampled answer may begin with part of an emoji, and an answer made only of
    # such parts comes from llama.cpp with no text and no input count (seen in a CI run:
    # content [] and input_tokens 0 beside 1,149 the next time)
    ask = sdk_call({**body, "temperature": 0}, "smol", 2)
    first = client.messages.create(**ask)
    again = client.messages.create(**ask)
    assert total_input(first.usage) == total_input(again.usage)
    # the breakpoint closes the prompt: what is not read is written, nothing plain
    assert again.usage.cache_read_input_tokens > 0.9 * total_input(again.usage)
    assert again.usage.input_tokens + again.usage.cache_creation_input_tokens \
        < 0.1 * total_input(again.usage)


def test_a_template_that_refuses_system_turns(client: anthropic.Anthropic,
                                              server: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": "Hi."},
                         {"role": "assistant", "content": "Hello."},
                         {"role": "system", "content": "Answer in one word."},
                         {"role": "user", "content": "Say hello."}]}
    for _ in range(2):  # refused and served folded, then folded at once
        message = client.messages.create(**sdk_call(body, "strict", 4))
        assert message.content and message.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(**sdk_call(body, "strict", 4)) as stream:
        assert stream.get_final_message().stop_reason in ("end_turn", "max_tokens")
    # the template refused once (llama.cpp's 400), and never again
    served = wait_for(lambda: [r["ok"] for r in requests_logged(server)
                               if r["model"] == "strict"] if len(
        [r for r in requests_logged(server) if r["model"] == "strict"]) >= 4 else None)
    assert served == [False, True, True, True]


def test_a_prompt_too_long_in_anthropic_words(client: anthropic.Anthropic) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 400}]}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**sdk_call(body, "tiny", 8))
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    assert "tokens > 256 maximum" in error["message"]
    assert "`ctx_size: 256`" in error["message"]
    with pytest.raises(anthropic.APIStatusError) as streamed:  # warm: before the stream opens
        with client.messages.stream(**sdk_call(body, "tiny", 8)) as stream:
            stream.get_final_message()
    assert streamed.value.status_code == 400
    assert "prompt is too long: " in str(streamed.value)


def test_a_context_that_fills(client: anthropic.Anthropic) -> None:
    count = " ".join(str(i) for i in range(1, 41))
    body = {"messages": [{"role": "user", "content": "Count from 1 to 300 with spaces: "
                          + count}], "temperature": 0}
    message = client.messages.create(**sdk_call(body, "tiny", 400))
    assert message.stop_reason == "model_context_window_exceeded", message
    assert total_input(message.usage) + message.usage.output_tokens == 256


def test_the_stream_opens_at_once_and_pings_through_a_long_wait(
        server: ServerProcess) -> None:
    body = {"model": "slow-remote", "max_tokens": 20, "stream": True,
            "messages": [{"role": "user", "content": "Say hello."}]}
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    with httpx.Client(base_url=server.url, headers={"x-api-key": USER_KEY},
                      timeout=60) as http, \
            http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                arrivals.append((time.monotonic() - started, line[7:]))
    kinds = [kind for _, kind in arrivals]
    assert kinds[0] == "message_start" and arrivals[0][0] < 1.0, arrivals[:3]
    assert kinds[-1] == "message_stop"
    first_content = kinds.index("content_block_start")
    waited = [at for at, kind in arrivals[:first_content] if kind == "ping"]
    assert len(waited) >= ANSWER_DELAY_MS / 1000 / PING_S - 2, arrivals
    # nothing is silent for much longer than the interval, in the wait or between chunks
    gaps = [b - a for (a, _), (b, _) in zip(arrivals, arrivals[1:], strict=False)]
    assert max(gaps) < PING_S * 2.5, gaps
    deltas = [i for i, kind in enumerate(kinds) if kind == "content_block_delta"]
    assert "ping" in kinds[deltas[0]:deltas[-1]]  # pings between slow chunks too


def test_the_sdk_reads_a_pinged_stream(client: anthropic.Anthropic) -> None:
    started = time.monotonic()
    with client.messages.stream(model="slow-remote", max_tokens=20,
                                messages=[{"role": "user", "content": "Say hello."}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "part0 part1 " and final.stop_reason == "end_turn"
    assert final.id.startswith("msg_")
    assert time.monotonic() - started >= ANSWER_DELAY_MS / 1000
