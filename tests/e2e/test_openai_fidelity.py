"""OpenAI fidelity through model-boss, with the official ``openai`` client (sync, async and
streaming) against llama.cpp's native server on SmolLM2; llama-server's own routes; the
default task; fair cooldowns. One coordinator for the module; answers kept a few tokens long.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow

# A Hermes-style template (as Qwen 2.5's): llama.cpp's parser finds its <tool_call> markers,
# so tool calls come back as OpenAI tool calls. SmolLM2's own template has no tools.
TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call functions. Signatures:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
Call one as <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>
<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role in ("system", "developer") and not tools %}<|im_start|>system
{{ message.content }}<|im_end|>
{% elif message.role == "user" %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == "assistant" %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {#
#}{{ call.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# the same template, thinking: the generation prompt opens <think> when enable_thinking is on
# and earlier turns' reasoning is rendered, so llama.cpp parses what follows as reasoning
THINK_TEMPLATE = TOOLS_TEMPLATE.replace(
    "{% elif message.role == \"assistant\" %}<|im_start|>assistant\n",
    "{% elif message.role == \"assistant\" %}<|im_start|>assistant\n{%- if "
    "message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n"
    "{% endif %}").replace(
    "{%- if add_generation_prompt %}<|im_start|>assistant\n",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is not "
    "defined or enable_thinking %}<think>\n{% endif %}")

TASKS = """
default_task: chat
tasks:
  chat:
    candidates: [smol]
"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}}}}}
# the tiny model seldom calls a tool by itself: a bias towards the call marker makes it
# (llama.cpp takes text keys in logit_bias); the grammar then writes the call
CALL_BIAS = {"<tool_call>": 30}
HI = [{"role": "user", "content": "Say hello."}]
SMALL = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    workdir = tmp_path_factory.mktemp("fidelity")
    (workdir / "tasks.yaml").write_text(TASKS)
    (workdir / "tools.jinja").write_text(TOOLS_TEMPLATE)
    (workdir / "think.jinja").write_text(THINK_TEMPLATE)
    manifests = [
        llama_manifest("smol", demo_gguf, aliases=["demo"]),
        llama_manifest("smol-tools", demo_gguf, chat_template=str(workdir / "tools.jinja")),
        # thinks on every request (the manifest's toggle), on two slots
        llama_manifest("smol-think", demo_gguf, chat_template=str(workdir / "think.jinja"),
                       thinking=True, parallel=2),
        llama_manifest("smol-embed", demo_gguf, embeddings=True, category="embedding",
                       pooling="mean"),
        llama_manifest("smol-crashy", demo_gguf),  # the cooldown test kills its workers
    ]
    srv = ServerProcess(workdir, {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}],
                                  "tasks_file": str(workdir / "tasks.yaml")}, manifests)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    # the client's own retries stay on (2): they must never turn a client fault into more
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture
def aclient(server):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")


def chat(client, **kwargs):
    kwargs.setdefault("model", "smol")
    kwargs.setdefault("messages", HI)
    kwargs.setdefault("max_tokens", SMALL)
    return client.chat.completions.create(**kwargs)


def streamed(client, **kwargs) -> list:
    return list(chat(client, stream=True, **kwargs))


def text_of(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def assert_clean(message: str) -> None:
    """No worker traceback, file path or internal address in what a client reads."""
    for leak in ("Traceback", "127.0.0.1", "localhost:", "/root/", "/home/", "/tmp/", ".py\""):
        assert leak not in message, message


# --- limits and usage ----------------------------------------------------------------------

def test_max_completion_tokens_limits_output(client):
    reply = chat(client, max_tokens=None, max_completion_tokens=3,
                 messages=[{"role": "user", "content": "Write a long story."}])
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"
    chunks = streamed(client, max_tokens=None, max_completion_tokens=3,
                      stream_options={"include_usage": True},
                      messages=[{"role": "user", "content": "Write a long story."}])
    assert chunks[-1].usage.completion_tokens == 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_max_completion_tokens_async(aclient):
    reply = await aclient.chat.completions.create(
        model="smol", messages=HI, max_completion_tokens=2)
    assert reply.usage.completion_tokens == 2


def test_stream_options_include_usage_yields_the_usage_chunk_last(client):
    chunks = streamed(client, stream_options={"include_usage": True})
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    completion = client.completions.create(model="smol", prompt="One, two,", max_tokens=3,
                                           stream=True, stream_options={"include_usage": True})
    assert list(completion)[-1].usage.completion_tokens == 3


async def test_stream_async_with_usage(aclient):
    stream = await aclient.chat.completions.create(
        model="smol", messages=HI, max_tokens=4, stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert text_of(chunks) and chunks[-1].usage.completion_tokens <= 4


# --- structured output ---------------------------------------------------------------------

FLAG_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}},
               "required": ["ok"], "additionalProperties": False}


def test_json_schema_constrains_output(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "flag", "schema": FLAG_SCHEMA,
                                                  "strict": True}}
    reply = chat(client, max_tokens=24, temperature=0, response_format=fmt,
                 messages=[{"role": "user", "content": "Is the sky blue? Answer in JSON."}])
    assert set(json.loads(reply.choices[0].message.content)) == {"ok"}
    chunks = streamed(client, max_tokens=24, temperature=0, response_format=fmt,
                      messages=[{"role": "user", "content": "Is grass green? Answer in JSON."}])
    assert set(json.loads(text_of(chunks))) == {"ok"}


def test_json_object_constrains_output(client):
    """Greedy decoding gives the demo model's object in 14 tokens: 48 always let it end, so
    the answer, whole or streamed, is one complete object."""
    ask = [{"role": "user", "content": "Give a JSON object with the key ok set to true."}]
    reply = chat(client, max_tokens=48, temperature=0, messages=ask,
                 response_format={"type": "json_object"})
    content = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", (reply.usage, content)
    assert isinstance(json.loads(content), dict), content
    chunks = streamed(client, max_tokens=48, temperature=0, messages=ask,
                      response_format={"type": "json_object"})
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert isinstance(json.loads(text_of(chunks)), dict), text_of(chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_an_invalid_json_schema_is_a_400_never_a_502(client, stream):
    fmt = {"type": "json_schema",
           "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, response_format=fmt, stream=stream)
    error = refused.value.body
    assert refused.value.status_code == 400 and "nonsense" in error["message"]
    assert_clean(error["message"])


# --- roles, choices, sampling --------------------------------------------------------------

def test_developer_role_reaches_the_template(client, server):
    messages = [{"role": "developer", "content": "Answer like a pirate, XYZZY."}, *HI]
    assert chat(client, messages=messages).choices[0].message.content
    prompt = httpx.post(server.url + "/apply-template",
                        json={"model": "smol", "messages": messages}, timeout=60).json()
    assert "XYZZY" in prompt["prompt"]
    assert text_of(streamed(client, messages=messages))


def test_n_above_one_is_a_400_saying_the_model_serves_one(client):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            chat(client, n=2, stream=stream)
        assert refused.value.body["code"] == "n_not_supported"
        assert "serves at most 1 choice" in refused.value.body["message"]
    assert len(chat(client, n=1).choices) == 1


def test_seed_makes_sampling_repeatable(client):
    story = [{"role": "user", "content": "Invent a name for a ship."}]
    first, second = (chat(client, messages=story, temperature=1.5, seed=1234, max_tokens=12)
                     .choices[0].message.content for _ in range(2))
    assert first == second
    streamed_twice = {text_of(streamed(client, messages=story, temperature=1.5, seed=99,
                                       max_tokens=12)) for _ in range(2)}
    assert len(streamed_twice) == 1


def test_stop_ends_the_answer_at_the_stop_string(client):
    ask = [{"role": "user", "content": "Describe a forest in one sentence."}]
    free = chat(client, messages=ask, max_tokens=12, temperature=0).choices[0].message.content
    word = free.split()[2]  # greedy decoding repeats itself: stop at its third word
    reply = chat(client, messages=ask, stop=[word], max_tokens=12, temperature=0)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == free[:free.index(word)]
    chunks = streamed(client, messages=ask, stop=word, max_tokens=12, temperature=0)
    assert text_of(chunks) == free[:free.index(word)]


def test_logprobs_and_top_logprobs(client):
    reply = chat(client, logprobs=True, top_logprobs=3, max_tokens=3)
    tokens = reply.choices[0].logprobs.content
    # one entry per token, except that llama.cpp reports a character whose UTF-8 bytes span
    # several tokens (an emoji) as one entry
    assert 1 <= len(tokens) <= 3 and all(len(t.top_logprobs) == 3 for t in tokens)
    assert all(t.logprob <= 0 for t in tokens)
    chunks = streamed(client, logprobs=True, top_logprobs=2, max_tokens=3)
    streamed_tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
                       for t in c.choices[0].logprobs.content]
    assert streamed_tokens and all(len(t.top_logprobs) == 2 for t in streamed_tokens)


def test_logit_bias_steers_the_tokens(client, server):
    token = httpx.post(server.url + "/tokenize", json={"model": "smol", "content": " banana"},
                       timeout=60).json()["tokens"][0]
    reply = chat(client, logit_bias={str(token): 100}, max_tokens=3, temperature=0)
    assert "banana" in reply.choices[0].message.content
    assert "banana" in text_of(streamed(client, logit_bias={str(token): 100}, max_tokens=3))


# --- tools ---------------------------------------------------------------------------------

def ask_weather(client, **kwargs):
    return chat(client, model="smol-tools", tools=[WEATHER], tool_choice="required",
                temperature=0, max_tokens=40, parallel_tool_calls=False,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                extra_body={"logit_bias": CALL_BIAS}, **kwargs)


def test_tools_answer_a_tool_call(client):
    reply = ask_weather(client)
    call = reply.choices[0].message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London")
    # under the marker's bias the tiny model may pad after the call until max_tokens
    assert reply.choices[0].finish_reason in ("tool_calls", "length")


def test_streamed_tool_calls_have_openais_shape(client):
    deltas = [c.choices[0] for c in ask_weather(client, stream=True) if c.choices]
    calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
    first, rest = calls[0], calls[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather"  # the name once, first ...
    assert rest and all(c.function.name is None and c.id is None for c in rest)
    arguments = "".join(c.function.arguments or "" for c in calls)  # ... then fragments
    assert json.loads(arguments)["city"] in ("Paris", "London")
    assert deltas[-1].finish_reason in ("tool_calls", "length")


async def test_streamed_tool_calls_async(aclient):
    stream = await aclient.chat.completions.create(
        model="smol-tools", tools=[WEATHER], tool_choice="required", temperature=0,
        max_tokens=40, stream=True, extra_body={"logit_bias": CALL_BIAS},
        messages=[{"role": "user", "content": "What is the weather in London?"}])
    names = [c.choices[0].delta.tool_calls[0].function.name async for c in stream
             if c.choices and c.choices[0].delta.tool_calls]
    assert names[0] == "get_weather" and not any(names[1:])


# --- client mistakes -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, param", [
    ({"tools": "nope"}, "tools"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tool_choice": "sometimes", "tools": [WEATHER]}, "tool_choice"),
    ({"top_logprobs": 99, "logprobs": True}, "top_logprobs"),
])
def test_client_mistakes_are_400_envelopes(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, **kwargs)
    assert refused.value.body["param"] == param
    assert refused.value.body["type"] == "invalid_request_error"


def test_what_the_worker_refuses_is_a_clean_400(client):
    image = [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            chat(client, messages=image, stream=stream)
        assert_clean(refused.value.body["message"])
    too_long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, messages=too_long)
    assert_clean(refused.value.body["message"])


# --- embeddings, Responses API, routes without /v1, llama.cpp routes ----------------------

def test_embeddings_of_a_chat_only_model_are_a_clean_400(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="smol", input="a cat")
    # refused before any load, with advice a user can follow: the manifest field
    assert refused.value.body["code"] == "unsupported_endpoint"
    assert "set `embeddings: true` in its manifest" in refused.value.body["message"]
    assert_clean(refused.value.body["message"])


def test_embeddings_on_an_embedding_manifest(client, server):
    result = client.embeddings.create(model="smol-embed", input=["a cat", "a dog"])
    assert [e.index for e in result.data] == [0, 1]
    assert len(result.data[0].embedding) == len(result.data[1].embedding) > 100
    bare = openai.OpenAI(base_url=server.url, api_key="unused")  # /embeddings, no /v1
    assert bare.embeddings.create(model="smol-embed", input="x").data[0].embedding


async def test_embeddings_async(aclient):
    result = await aclient.embeddings.create(model="smol-embed", input="a bird")
    assert len(result.data) == 1 and result.data[0].embedding


def test_responses_api(client):
    response = client.responses.create(model="smol", input="Say hello.", max_output_tokens=6)
    assert response.status == "completed" and response.output_text
    events = list(client.responses.create(model="smol", input="Say hello.",
                                          max_output_tokens=6, stream=True))
    kinds = {event.type for event in events}
    assert {"response.created", "response.output_text.delta", "response.completed"} <= kinds
    assert events[-1].response.output_text


# --- the Responses API as coding agents read it ------------------------------------------

ITEM_EVENTS = ("response.output_item.", "response.content_part.", "response.output_text.",
               "response.reasoning_text.", "response.function_call_arguments.")
PART_EVENTS = ("response.content_part.", "response.output_text.", "response.reasoning_text.")


def assert_numbered_and_indexed(events) -> None:
    """Every event numbered from 0 by 1; item events indexed; each item added then done at
    its index; the last response lists the items the stream told, in their order."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done = {}, {}
    for event in events:
        if event.type.startswith(ITEM_EVENTS):
            assert isinstance(event.output_index, int), event
        if event.type.startswith(PART_EVENTS):
            assert isinstance(event.content_index, int), event
        if event.type == "response.output_item.added":
            added[event.output_index] = event.item.id
        if event.type == "response.output_item.done":
            done[event.output_index] = event.item.id
    assert added == done and sorted(added) == list(range(len(added)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    final = events[-1].response
    assert final.id.startswith("resp_") and final.id == events[0].response.id
    assert [item.id for item in final.output] == [added[i] for i in sorted(added)]


def test_a_responses_stream_is_numbered_and_indexed(client):
    events = list(client.responses.create(model="smol", input="Say hello.",
                                          max_output_tokens=6, stream=True))
    assert_numbered_and_indexed(events)
    kinds = [e.type for e in events]
    assert kinds.count("response.output_text.done") == 1
    assert kinds.count("response.content_part.done") == 1
    assert events[-1].response.usage.input_tokens_details.cached_tokens >= 0


def test_thinking_is_a_reasoning_item(client):
    events = list(client.responses.create(model="smol-think", input="Say hello.",
                                          max_output_tokens=8, temperature=0, stream=True))
    assert_numbered_and_indexed(events)
    first = next(e for e in events if e.type == "response.output_item.added")
    assert first.item.type == "reasoning" and first.output_index == 0
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert deltas and done.text == "".join(d.delta for d in deltas)
    reasoning = events[-1].response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content[0].text == done.text
    usage = events[-1].response.usage
    assert 0 < usage.output_tokens_details.reasoning_tokens <= usage.output_tokens


def test_streamed_function_calls_are_numbered_items(client):
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": WEATHER["function"]["parameters"]}
    events = list(client.responses.create(
        model="smol-tools", input="What is the weather in Paris?", tools=[tool],
        max_output_tokens=40, temperature=0, stream=True,
        extra_body={"logit_bias": CALL_BIAS}))
    assert_numbered_and_indexed(events)
    call = next(e.item for e in events if e.type == "response.output_item.done")
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.call_id
    closing = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
              and e.output_index == closing.output_index]
    assert closing.arguments == "".join(deltas) == call.arguments


def test_a_whole_response_with_a_prompt_cache_key(client):
    ask = dict(model="smol-think", input="Say hello.", max_output_tokens=4, temperature=0,
               prompt_cache_key="session-1")
    first = client.responses.create(**ask)
    again = client.responses.create(**ask)
    assert first.id.startswith("resp_") and first.id != again.id
    assert all(item.id and item.status == "completed" for item in first.output)
    assert first.output[0].type == "reasoning"
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    # the same session on the same slot: its prompt read from the cache
    assert again.usage.input_tokens_details.cached_tokens > 0


async def test_responses_api_async(aclient):
    response = await aclient.responses.create(model="smol", input="Hi", instructions="Be brief.",
                                              max_output_tokens=4)
    assert response.output_text


def test_routes_answer_without_the_v1_prefix(server):
    bare = openai.OpenAI(base_url=server.url, api_key="unused")
    assert {m.id for m in bare.models.list().data} >= {"smol", "smol-embed"}
    assert chat(bare).choices[0].message.content
    assert text_of(streamed(bare))
    # /completions without /v1 is llama.cpp's native one, as llama-server answers it
    # (tests/e2e/test_llama_parity.py)
    assert bare.responses.create(model="smol", input="Hi", max_output_tokens=3).output_text


def test_llama_cpp_routes_reach_the_named_worker(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        tokens = http.post("/tokenize", json={"model": "demo", "content": "Hello"}).json()
        assert tokens["tokens"]
        assert http.post("/detokenize", json={"model": "smol", **tokens}).json() == {
            "content": "Hello"}
        done = http.post("/completion", json={"model": "smol", "prompt": "Hello",
                                              "n_predict": 3})
        assert done.status_code == 200 and done.headers["x-model-boss-model"] == "smol"
        assert done.json()["tokens_predicted"] == 3
        with http.stream("POST", "/completion", json={"model": "smol", "prompt": "Hi",
                                                      "n_predict": 3, "stream": True}) as sse:
            lines = [line for line in sse.iter_lines() if line.startswith("data: ")]
        assert len(lines) >= 3
        template = http.post("/apply-template", json={"model": "smol", "messages": HI})
        assert "Say hello." in template.json()["prompt"]
        infill = http.post("/infill", json={"model": "smol", "input_prefix": "def f(",
                                            "input_suffix": "):\n    pass"})
        assert infill.status_code == 400  # SmolLM2 has no fill-in-the-middle tokens
        assert infill.json()["error"]["code"] == "unsupported_request"
        props = http.get("/props", params={"model": "smol"}).json()
        assert props["model_path"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert props["model_alias"] == "smol" and props["total_slots"] == 1


def test_a_request_without_a_model_goes_to_the_default_task(server, client):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        reply = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert reply.status_code == 200 and reply.headers["x-model-boss-model"] == "smol"
        null = http.post("/chat/completions", json={"model": None, "messages": HI,
                                                    "max_tokens": 2})
        assert null.headers["x-model-boss-model"] == "smol"
        assert http.post("/tokenize", json={"content": "Hello"}).json()["tokens"]
        assert http.get("/props").json()["model_alias"] == "smol"


# --- fair cooldowns --------------------------------------------------------------------------

def test_client_mistakes_never_cool_anyone_down(client, server):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nope"}}}
    for _ in range(12):  # well past the failure threshold, retries included
        with pytest.raises(openai.BadRequestError):
            chat(client, response_format=bad)
    assert chat(client).choices[0].message.content  # anonymous, same model: served
    failing = server.status()["queue"]["failing_models"]
    assert not [m for m in failing if m["model"] == "smol"]


def test_a_model_whose_worker_keeps_dying_cools_down_alone(server):
    """Five requests in a row broken by a dead worker: that model answers 503 with
    Retry-After to every caller; other models serve the same anonymous caller."""
    # a story the model may end early would finish before the kill: no failure to count
    body = {"model": "smol-crashy", "stream": True, "max_tokens": 300, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a very long story."}]}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for _ in range(5):
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                events = [line for line in _kill_after_two_events(response, server)]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][6:])["error"]["code"] == "worker_failed"
        for who in ({}, {"x-client-id": "someone-else"}):
            cooling = http.post("/v1/chat/completions", headers=who,
                                json={**body, "stream": False, "max_tokens": 2})
            assert cooling.status_code == 503, cooling.text
            assert cooling.json()["error"]["code"] == "model_cooling_down"
            assert int(cooling.headers["retry-after"]) > 0
        other = http.post("/v1/chat/completions",
                          json={"model": "smol", "messages": HI, "max_tokens": 2})
        assert other.status_code == 200


def _kill_after_two_events(response, server):
    """The stream's lines; the model's worker is SIGKILLed after the second event (the
    comment lines a load longer than a second sends first are no events: a kill then would
    be a failed load, not a failure mid-answer)."""
    events, killed = 0, False
    for line in (line for line in response.iter_lines() if line):
        if events == 2 and not killed:
            slot = next(s for s in server.status()["slots"] if s["model"] == "smol-crashy")
            os.kill(slot["pid"], signal.SIGKILL)
            killed = True
        events += line.startswith("data: ")
        yield line


async def test_concurrent_async_clients(aclient):
    replies = await asyncio.gather(*[
        aclient.chat.completions.create(model="smol", messages=HI, max_tokens=3)
        for _ in range(3)])
    assert all(r.choices[0].message.content for r in replies)
