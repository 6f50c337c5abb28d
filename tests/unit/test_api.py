"""The HTTP surface in-process (httpx.ASGITransport) over in-process backends."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
import uvicorn
import yaml

from model_boss.api.app import create_app
from model_boss.backends.base import UpstreamResponse
from model_boss.errors import WorkerCrashed

from .fakes import FakeBackend, coordinator, manifest, started_client


@pytest.fixture
async def api(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("a", 1000, aliases=["alias-a"], embeddings=True),
                                        manifest("b", 1000)],
                             api_key="user-key", admin_api_key="admin-key")
    async with started_client(coord) as client:
        yield client, coord


USER = {"authorization": "Bearer user-key"}
ADMIN = {"authorization": "Bearer admin-key"}
CHAT = {"model": "alias-a", "messages": [{"role": "user", "content": "hi"}]}


async def test_keys_are_required_where_configured(api):
    client, _ = api
    denied = await client.post("/v1/chat/completions", json=CHAT)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    wrong = await client.post("/v1/chat/completions", json=CHAT,
                              headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = await client.post("/v1/chat/completions", json=CHAT, headers=USER)
    assert ok.status_code == 200 and ok.headers["x-model-boss-model"] == "a"
    assert (await client.get("/api/v1/status", headers=USER)).status_code == 401
    assert (await client.get("/api/v1/status", headers=ADMIN)).status_code == 200
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200


async def test_unknown_route_and_method_use_the_envelope(api):
    client, _ = api
    missing = await client.get("/v1/nothing-here", headers=USER)
    assert missing.status_code == 404 and set(missing.json()["error"]) == {
        "message", "type", "param", "code"}
    wrong = await client.get("/v1/chat/completions", headers=USER)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


async def test_admin_load_pin_unload(api):
    client, coord = api
    loaded = await client.post("/api/v1/models/b/load", headers=ADMIN)
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready"
    pinned = await client.post("/api/v1/models/b/pin", headers=ADMIN)
    assert pinned.json()["pinned"] is True and pinned.json()["unload_at"] is None
    assert (await client.post("/api/v1/models/b/unload", headers=ADMIN)).json()["unloaded"]
    assert coord.pool.slots["b"].state == "idle"
    assert (await client.post("/api/v1/models/zzz/load", headers=ADMIN)).status_code == 404


async def test_config_and_events_and_metrics(api):
    client, _ = api
    assert (await client.get("/api/v1/config", headers=ADMIN)).json() == {
        "allowCloudFallback": True}
    put = await client.put("/api/v1/config", headers=ADMIN, json={"allowCloudFallback": False})
    assert put.json() == {"allowCloudFallback": False}
    assert (await client.put("/api/v1/config", headers=ADMIN, content=b"{x")).status_code == 400
    await client.post("/v1/chat/completions", json=CHAT, headers=USER)
    events = (await client.get("/api/v1/events?stream=false", headers=ADMIN)).json()["events"]
    kinds = [e["type"] for e in events]
    assert "config_changed" in kinds and "loaded" in kinds
    since = events[-1]["seq"]
    later = (await client.get(f"/api/v1/events?stream=false&since={since}",
                              headers=ADMIN)).json()["events"]
    assert later == []
    metrics = (await client.get("/metrics")).text
    assert 'model_boss_loads_total{model="a"} 1.0' in metrics
    assert 'model_boss_requests_total{endpoint="/v1/chat/completions",model="a",' \
           'status="200"} 1.0' in metrics
    assert 'model_boss_gpu_leased_mb{gpu="0"} 1000.0' in metrics


async def test_models_listing(api):
    client, _ = api
    data = (await client.get("/v1/models", headers=USER)).json()["data"]
    assert [m["id"] for m in data] == ["a", "b"]
    assert data[0]["aliases"] == ["alias-a"] and data[0]["available"] is True


# --- bad input is a 400 envelope, never a 5xx -------------------------------------------

def assert_envelope(response, status: int, param: str | None = "-") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param != "-":
        assert error["param"] == param
    return error


POSTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/audio/speech",
         "/v1/images/generations", "/api/v1/jobs", "/api/v1/leases", "/api/v1/models/a/load"]


@pytest.mark.parametrize("path", POSTS + ["PUT /api/v1/config"])
async def test_json_nested_a_thousand_deep_is_400(api, path):
    client, _ = api
    method, _, path = path.rpartition(" ")
    deep = b"[" * 1000 + b"]" * 1000
    body = b'{"model": "a", "messages": [{"role": "user", "content": "x"}], "x": ' + deep + b"}"
    key = ADMIN if path.startswith("/api/") else USER
    response = await client.request(method or "POST", path, content=body,
                                    headers={**key, "content-type": "application/json"})
    assert "deeper than" in assert_envelope(response, 400, None)["message"]


async def test_json_nested_within_the_limit_is_served(api):
    client, _ = api
    nested = {"model": "a", "messages": [{"role": "user", "content": "x"}],
              "metadata": [[[["deep enough"]]]]}
    assert (await client.post("/v1/chat/completions", json=nested, headers=USER)).is_success


@pytest.mark.parametrize("extra, param", [
    (b'"seed": 123456789012345678901234567890', None), (b'"max_tokens": 1e30', "max_tokens"),
    (b'"logit_bias": {"1": -99999999999999999999}', None)])
async def test_numbers_no_worker_could_read_are_400(api, extra, param):
    client, _ = api
    body = b'{"model": "a", "messages": [{"role": "user", "content": "x"}], ' + extra + b"}"
    response = await client.post("/v1/chat/completions", content=body,
                                 headers={**USER, "content-type": "application/json"})
    assert_envelope(response, 400, param)
    digits = {**CHAT, "user": "12345678901234567890123456789"}  # in a string: fine
    assert (await client.post("/v1/chat/completions", json=digits, headers=USER)).is_success


async def test_image_model_as_a_list_is_400(api):
    client, _ = api
    response = await client.post("/v1/images/generations", headers=USER,
                                 json={"model": ["a"], "prompt": "a cat"})
    assert_envelope(response, 400, "model")


@pytest.mark.parametrize("query", ["priority=abc", "priority=-1", "priority=101"])
async def test_load_priority_that_is_not_a_priority_is_400(api, query):
    client, _ = api
    response = await client.post(f"/api/v1/models/a/load?{query}", headers=ADMIN)
    assert_envelope(response, 400, "priority")
    assert (await client.post("/api/v1/models/a/load?priority=3", headers=ADMIN)).is_success


async def test_n_above_what_the_model_serves_is_400(api):
    client, coord = api
    response = await client.post("/v1/chat/completions", headers=USER, json={**CHAT, "n": 3})
    error = assert_envelope(response, 400, "n")
    assert "serves at most 1 choice" in error["message"] and error["code"] == "n_not_supported"
    completion = await client.post("/v1/completions", headers=USER,
                                   json={"model": "a", "prompt": "x", "n": 2})
    assert_envelope(completion, 400, "n")
    assert (await client.post("/v1/chat/completions", headers=USER,
                              json={**CHAT, "n": 1})).is_success
    assert coord.queue.depth == 0


@pytest.mark.parametrize("where", ["body", "header"])
async def test_empty_client_id_is_400(api, where):
    client, _ = api
    body, headers = dict(CHAT), dict(USER)
    if where == "body":
        body["x_client_id"] = ""
    else:
        headers["x-client-id"] = ""
    response = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert_envelope(response, 400, "x_client_id")


@pytest.mark.parametrize("method, path", [("POST", "/api/v1/jobs"), ("PUT", "/api/v1/config"),
                                          ("POST", "/api/v1/leases"),
                                          ("POST", "/v1/chat/completions")])
async def test_every_body_goes_through_the_size_limit(tmp_path, method, path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], max_body_bytes=2048)
    app = create_app(coordinator=coord)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1") as client:
        big = b'{"note": "' + b"x" * 4096 + b'"}'
        declared = await client.request(method, path, content=big)
        assert assert_envelope(declared, 413)["code"] == "payload_too_large"

        async def chunks():  # no content-length: counted as it arrives
            for _ in range(8):
                yield b" " * 512

        streamed = await client.request(method, path, content=chunks())
        assert assert_envelope(streamed, 413)["code"] == "payload_too_large"


async def test_a_bug_is_a_500_envelope_and_the_app_does_not_raise(api, monkeypatch):
    """httpx.ASGITransport re-raises what the app raises: getting a response at all shows
    the app answered the error itself (uvicorn would close the connection otherwise)."""
    client, _ = api

    async def broken(self, endpoint, body, stream):
        raise RuntimeError("a bug")

    monkeypatch.setattr(FakeBackend, "handle_request", broken)
    response = await client.post("/v1/chat/completions", json=CHAT, headers=USER)
    assert assert_envelope(response, 500)["code"] == "internal_error"
    assert (await client.get("/health")).status_code == 200


async def test_a_500_keeps_the_keep_alive_connection(tmp_path, monkeypatch):
    """Against a real uvicorn: the request after a 500 arrives on the same connection."""
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])

    async def broken(self, endpoint, body, stream):
        raise RuntimeError("a bug")

    monkeypatch.setattr(FakeBackend, "handle_request", broken)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(coordinator=coord), log_level="warning",
                                           lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=url) as client:
            failed = await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})
            assert failed.status_code == 500 and failed.headers.get("connection") != "close"
            after = await client.get("/health")
            assert after.status_code == 200
            assert after.extensions["network_stream"] is failed.extensions["network_stream"]
    finally:
        server.should_exit = True
        await serving


async def test_a_stream_that_fails_ends_with_an_sse_error_then_done(api, monkeypatch):
    client, coord = api

    async def failing_stream(self, endpoint, body, stream):
        async def chunks():
            yield b'data: {"choices": []}\n\n'
            raise WorkerCrashed("worker for 'a' exited with -9")

        return UpstreamResponse(200, {"content-type": "text/event-stream"}, stream=chunks())

    monkeypatch.setattr(FakeBackend, "handle_request", failing_stream)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                 headers=USER)
    events = [line for line in response.text.split("\n\n") if line]
    assert events[0] == 'data: {"choices": []}' and events[-1] == "data: [DONE]"
    error = json.loads(events[1].removeprefix("data: "))["error"]
    assert error["code"] == "worker_failed" and "exited with -9" in error["message"]
    assert coord.pool.slots["a"].to_dict()["active_requests"] == 0


async def test_metrics_declare_the_text_format_version(api):
    client, _ = api
    response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")


async def test_openapi_documents_every_body(api):
    client, _ = api
    spec = (await client.get("/openapi.json", headers=USER)).json()
    for method, path in [("post", "/v1/chat/completions"), ("post", "/v1/completions"),
                         ("post", "/v1/embeddings"), ("post", "/v1/audio/speech"),
                         ("post", "/v1/images/generations"), ("post", "/api/v1/jobs"),
                         ("put", "/api/v1/config"), ("post", "/api/v1/leases")]:
        body = spec["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["schema"], (method, path)
    chat = spec["components"]["schemas"]["ChatRequest"]
    assert {"messages", "model", "n", "x_client_id", "x_priority"} <= set(chat["properties"])


async def test_openapi_writes_bounds_as_json_schemas_own_keywords(api):
    """A bound on a request number (``x_priority`` 0-100, ``max_tokens`` at least 1) is
    ``minimum`` / ``maximum`` in the document, never the Python name pydantic leaves on a
    validated type (``ge``, ``le``), which clients and fuzzers do not read as a bound."""
    client, _ = api
    spec = (await client.get("/openapi.json", headers=USER)).json()
    left: list[str] = []

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                left.extend(f"{where}.{raw}" for raw in ("ge", "le", "gt", "lt") if raw in node)
            for key, child in node.items():
                walk(child, f"{where}.{key}")
        elif isinstance(node, list):
            for child in node:
                walk(child, where)

    walk(spec, "")
    assert not left, left[:10]
    schemas = spec["components"]["schemas"]
    priority = schemas["ChatRequest"]["properties"]["x_priority"]["anyOf"][0]
    assert (priority["minimum"], priority["maximum"]) == (0, 100), priority
    # a field with a bound of its own and the 64-bit range of its type: the tighter of each
    assert schemas["MessagesRequest"]["properties"]["max_tokens"]["minimum"] == 1
    assert schemas["MessagesRequest"]["properties"]["max_tokens"]["maximum"] == 2**63 - 1


async def test_openapi_documents_each_api_in_its_own_error_envelope(api):
    """Ollama's routes answer {"error": "..."}, Anthropic's its own, the rest OpenAI's; a
    malformed body is a 400 there, never the 422 FastAPI would document."""
    client, _ = api
    spec = (await client.get("/openapi.json", headers=USER)).json()

    def error_schema(method: str, path: str) -> str:
        responses = spec["paths"][path][method]["responses"]
        assert "422" not in responses, (method, path)
        return responses["4XX"]["content"]["application/json"]["schema"]["$ref"].rsplit("/")[-1]

    assert error_schema("post", "/api/chat") == "OllamaError"
    assert spec["components"]["schemas"]["OllamaError"]["properties"]["error"]["type"] == \
        "string"
    assert error_schema("post", "/v1/messages") == "AnthropicError"
    assert error_schema("post", "/v1/chat/completions") == "OpenAIError"
    assert error_schema("post", "/completion") == "OpenAIError"
    assert error_schema("post", "/api/v1/leases") == "OpenAIError"
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_create_app_reads_the_config_file_named_by_the_environment(tmp_path, monkeypatch):
    (tmp_path / "m.yaml").write_text(yaml.safe_dump([{"id": "from-file", "path": "w.gguf",
                                                       "vram_mb": 100}]))
    config = tmp_path / "model-boss.yaml"
    config.write_text(yaml.safe_dump({
        "port": 8299, "manifests": ["m.yaml"], "tasks_file": None, "use_nvml": False,
        "state_dir": "state", "gpus": [{"index": 0, "vram_mb": 1024}]}))
    monkeypatch.setenv("MODEL_BOSS_CONFIG", str(config))
    coord = create_app().state.coordinator
    assert coord.settings.port == 8299 and "from-file" in coord.catalog
    assert coord.settings.state_dir == tmp_path / "state"


async def test_admin_models_offload_and_unload_with_wait(api):
    client, coord = api
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=USER)).status_code == 200
    listed = (await client.get("/api/v1/models", headers=ADMIN)).json()["models"]
    by_id = {m["id"]: m for m in listed}
    assert by_id["a"]["slot"]["state"] == "ready" and by_id["a"]["slot"]["tier"] == "gpu"
    assert by_id["a"]["aliases"] == ["alias-a"] and by_id["b"]["slot"] is None
    refused = await client.post("/api/v1/models/a/offload", headers=ADMIN)
    assert refused.status_code == 400  # the fake backend cannot park weights in RAM
    assert refused.json()["error"]["code"] == "offload_unsupported"
    gate = asyncio.Event()
    coord.pool.slots["a"].backend.gate = gate
    running = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=USER))
    await asyncio.sleep(0.05)
    busy = await client.post("/api/v1/models/a/unload", headers=ADMIN)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "model_busy"
    assert "retry-after" in busy.headers
    unload = asyncio.create_task(client.post("/api/v1/models/a/unload?wait_s=5", headers=ADMIN))
    await asyncio.sleep(0.05)
    assert coord.pool.slots["a"].state == "draining"
    gate.set()
    assert (await running).status_code == 200
    assert (await unload).json() == {"model": "a", "unloaded": True}
    assert coord.pool.slots["a"].state == "idle"
    bad = await client.post("/api/v1/models/a/unload?wait_s=-1", headers=ADMIN)
    assert bad.status_code == 400


# --- OpenAI fidelity, llama-server's routes, defaults, fair cooldowns ---------------------

def recording(monkeypatch) -> list[tuple[str, str, dict]]:
    """Every request a fake worker gets: (model, endpoint, body)."""
    seen: list[tuple[str, str, dict]] = []

    async def handle(self, endpoint, body, stream):
        seen.append((self.entry.manifest.id, endpoint, body))
        return UpstreamResponse(200, {"content-type": "application/json"}, body=b'{"ok": 1}')

    monkeypatch.setattr(FakeBackend, "handle_request", handle)
    return seen


def refusing(monkeypatch, error_for) -> None:
    async def handle(self, endpoint, body, stream):
        raise error_for()

    monkeypatch.setattr(FakeBackend, "handle_request", handle)


@pytest.mark.parametrize("body, param", [
    ({"tools": "nope"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools.0.function.name"),
    ({"tool_choice": "bogus"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}}},
     "response_format.json_schema"),
    ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"logit_bias": {"42": 500}}, "logit_bias.42"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"seed": "seven"}, "seed"),
    ({"stop": 5}, "stop"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
])
async def test_openai_fields_a_worker_could_not_read_are_400(api, body, param):
    client, coord = api
    response = await client.post("/v1/chat/completions", headers=USER, json={**CHAT, **body})
    assert_envelope(response, 400, param)
    assert coord.queue.depth == 0


@pytest.mark.parametrize("body, param", [
    ({"dimensions": "10"}, "dimensions"),
    ({"dimensions": 0}, "dimensions"),
    ({"encoding_format": "int8"}, "encoding_format"),
    ({"encoding_format": 1}, "encoding_format"),
    ({"user": 7}, "user"),
])
async def test_embedding_fields_of_the_wrong_type_are_400(api, body, param):
    client, coord = api
    response = await client.post("/v1/embeddings", headers=USER,
                                 json={"model": "a", "input": "x", **body})
    assert_envelope(response, 400, param)
    assert coord.queue.depth == 0


async def test_embedding_fields_reach_the_worker_as_sent(api, monkeypatch):
    client, _ = api
    seen = recording(monkeypatch)
    fields = {"model": "a", "input": "x", "dimensions": 8, "encoding_format": "base64",
              "user": "u1"}
    response = await client.post("/v1/embeddings", headers=USER, json=fields)
    assert response.status_code == 200, response.text
    assert seen[0][2] == fields


async def test_openai_fields_reach_the_worker_as_sent(api, monkeypatch):
    client, _ = api
    seen = recording(monkeypatch)
    fields = {"max_completion_tokens": 4, "stream_options": {"include_usage": True},
              "response_format": {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": {"type": "object"}}},
              "logprobs": True, "top_logprobs": 2, "logit_bias": {"42": -100}, "seed": 7,
              "stop": ["\n"], "tools": [{"type": "function", "function": {"name": "f"}}],
              "tool_choice": "required", "top_k": 5}
    response = await client.post("/v1/chat/completions", headers=USER,
                                 json={**CHAT, **fields})
    assert response.status_code == 200, response.text
    assert seen[0][2] == {**CHAT, **fields, "model": "a"}


@pytest.mark.parametrize("path, body, endpoint", [
    ("/chat/completions", CHAT, "/v1/chat/completions"),
    ("/completions", {"model": "a", "prompt": "x"}, "/completions"),  # llama.cpp's native
    ("/embeddings", {"model": "a", "input": "x"}, "/v1/embeddings"),
    ("/responses", {"model": "a", "input": "x"}, "/v1/responses"),
    ("/v1/responses", {"model": "a", "input": "x"}, "/v1/responses"),
    ("/completion", {"model": "b", "prompt": "x", "n_predict": 2}, "/completion"),
    ("/infill", {"model": "b", "input_prefix": "def f(", "input_suffix": ")"}, "/infill"),
    ("/tokenize", {"model": "b", "content": "hello"}, "/tokenize"),
    ("/detokenize", {"model": "b", "tokens": [1, 2]}, "/detokenize"),
    ("/apply-template", {"model": "b", "messages": [{"role": "user", "content": "x"}]},
     "/apply-template"),
])
async def test_llama_server_routes_reach_the_named_models_worker(api, monkeypatch, path, body,
                                                                  endpoint):
    client, coord = api
    seen = recording(monkeypatch)
    response = await client.post(path, headers=USER, json=body)
    assert response.status_code == 200, response.text
    expected = coord.catalog.get(body["model"]).manifest.id
    assert seen == [(expected, endpoint, {**body, "model": expected})]
    assert response.headers["x-model-boss-model"] == expected
    assert coord.queue.granted_total == 1  # through the queue, like every request


async def test_llama_server_routes_take_keys_and_check_bodies(api):
    client, _ = api
    assert (await client.post("/tokenize", json={"model": "a", "content": "x"})).status_code \
        == 401
    assert (await client.get("/models")).status_code == 401
    assert_envelope(await client.post("/tokenize", headers=USER, json={"model": "a"}), 400,
                    "content")
    assert_envelope(await client.post("/detokenize", headers=USER,
                                      json={"model": "a", "tokens": "x"}), 400, "tokens")
    data = (await client.get("/models", headers=USER)).json()["data"]
    assert [m["id"] for m in data] == ["a", "b"]


async def test_props_come_from_the_named_worker_without_its_paths(api, monkeypatch):
    client, coord = api

    def worker(request: httpx.Request) -> httpx.Response:
        assert request.method == "GET" and request.url.path == "/props"
        return httpx.Response(200, json={"model_path": "/srv/models/secret/b.gguf",
                                         "model_alias": "b", "total_slots": 1})

    monkeypatch.setattr(FakeBackend, "_client", httpx.AsyncClient(
        transport=httpx.MockTransport(worker), base_url="http://worker"), raising=False)
    response = await client.get("/props?model=b", headers=USER)
    assert response.status_code == 200, response.text
    assert response.json() == {"model_path": "b.gguf", "model_alias": "b", "total_slots": 1}
    assert response.headers["x-model-boss-model"] == "b"
    assert coord.queue.granted_total == 1


async def test_props_of_a_worker_that_has_none_is_400(api):
    client, _ = api
    error = assert_envelope(await client.get("/props?model=a", headers=USER), 400, "model")
    assert error["code"] == "unsupported_endpoint"


async def test_without_a_default_task_a_missing_model_is_a_400_that_says_how(api):
    client, _ = api
    for body in ({"messages": CHAT["messages"]}, {**CHAT, "model": None}):
        error = assert_envelope(await client.post("/v1/chat/completions", headers=USER,
                                                  json=body), 400, "model")
        assert "default_task" in error["message"] and "tasks.yaml" in error["message"]
    assert_envelope(await client.post("/tokenize", headers=USER, json={"content": "x"}), 400,
                    "model")


async def test_a_request_without_a_model_goes_to_the_default_task(api, monkeypatch):
    from model_boss.catalog.tasks import TaskRegistry

    client, coord = api
    tasks = TaskRegistry.from_mapping(
        {"default_task": "chat", "tasks": {"chat": {"candidates": ["b"]}}}, coord.catalog)
    coord.tasks = coord.router.tasks = tasks
    seen = recording(monkeypatch)
    for body in ({"messages": CHAT["messages"]}, {**CHAT, "model": None}):
        response = await client.post("/v1/chat/completions", headers=USER, json=body)
        assert response.status_code == 200 and response.headers["x-model-boss-model"] == "b"
    assert (await client.post("/tokenize", headers=USER, json={"content": "x"})).is_success
    assert (await client.get("/props", headers=USER)).status_code == 400  # b: no llama.cpp
    assert [model for model, _, _ in seen] == ["b", "b", "b"]
    named = await client.post("/v1/chat/completions", headers=USER, json=CHAT)
    assert named.headers["x-model-boss-model"] == "a"  # a named model still wins


WORKER_ANSWERS = [  # (status, body) → (status, code) a client sees
    (400, {"error": {"code": 400, "message": "JSON schema error at #/properties/a: bad",
                     "type": "invalid_request_error"}}, 400, "invalid_request"),
    (500, {"error": {"code": 500, "message": "Failed to parse tools: Expected 'tools' to be "
                     "an array", "type": "server_error"}}, 400, "invalid_request"),
    (500, {"error": {"code": 500, "message": "image input is not supported",
                     "type": "server_error"}}, 400, "invalid_request"),
    (501, {"error": {"code": 501, "message": "This server does not support embeddings.",
                     "type": "not_supported_error"}}, 400, "unsupported_request"),
    (401, {"error": {"code": 401, "message": "Invalid API Key"}}, 502, "upstream_error"),
    (500, {"error": {"message": "out of memory"}}, 502, "upstream_error"),
]


@pytest.mark.parametrize("status, body, expected, code", WORKER_ANSWERS)
async def test_worker_answers_keep_client_faults_400_and_the_rest_502(api, monkeypatch, status,
                                                                      body, expected, code):
    from model_boss.backends.base import upstream_error

    client, _ = api
    refusing(monkeypatch, lambda: upstream_error("a", status, json.dumps(body).encode()))
    error = assert_envelope(await client.post("/v1/chat/completions", headers=USER,
                                              json=CHAT), expected)
    assert error["code"] == code
    # a client fault keeps the worker's own type where it names one of its own (llama.cpp's
    # not_supported_error), else OpenAI's; a server fault is a server_error
    own = body["error"].get("type")
    assert error["type"] == ("server_error" if expected != 400 else
                             own if own not in (None, "server_error") else "invalid_request_error")


async def test_no_traceback_path_or_internal_address_reaches_a_client(api, monkeypatch):
    from model_boss.backends.base import upstream_error

    client, _ = api
    leaky = ("bad things at http://127.0.0.1:41234/v1/chat/completions in "
             "/home/ci/.cache/model-boss/models/a.gguf (127.0.0.1:41234)\n"
             "Traceback (most recent call last):\n  File \"/usr/lib/python3/x.py\", line 3\n"
             "ValueError: boom")
    refusing(monkeypatch, lambda: upstream_error("a", 500, leaky.encode()))
    error = assert_envelope(await client.post("/v1/chat/completions", headers=USER,
                                              json=CHAT), 502)
    message = error["message"]
    for secret in ("127.0.0.1", "41234", "/home/ci", "Traceback", "x.py", "http://"):
        assert secret not in message, message
    assert "a.gguf" in message and "bad things" in message
    refusing(monkeypatch, lambda: WorkerCrashed(
        "worker for 'a' exited with -9; last worker output: File \"/opt/w/server.py\", line 9"))
    streamed = await client.post("/v1/chat/completions", headers=USER, json=CHAT)
    assert "/opt/w" not in assert_envelope(streamed, 502)["message"]


async def test_client_faults_never_cool_a_model_down(api, monkeypatch):
    from model_boss.backends.base import upstream_error

    client, coord = api
    refusing(monkeypatch, lambda: upstream_error("a", 400, b'{"error": "bad request"}'))
    for _ in range(coord.queue.requestors.failure_threshold * 3):
        assert (await client.post("/v1/chat/completions", headers=USER,
                                  json=CHAT)).status_code == 400
    recording(monkeypatch)
    assert (await client.post("/v1/chat/completions", headers=USER, json=CHAT)).is_success


async def test_worker_failures_cool_down_that_model_for_everyone_and_no_other(api,
                                                                             monkeypatch):
    client, coord = api
    refusing(monkeypatch, lambda: WorkerCrashed("worker for 'a' exited with -9"))
    for _ in range(coord.queue.requestors.failure_threshold):
        assert (await client.post("/v1/chat/completions", headers=USER,
                                  json=CHAT)).status_code == 502
    recording(monkeypatch)
    for headers in (USER, {**USER, "x-client-id": "someone-else"}):
        cooling = await client.post("/v1/chat/completions", headers=headers, json=CHAT)
        assert assert_envelope(cooling, 503)["code"] == "model_cooling_down"
        assert int(cooling.headers["retry-after"]) > 0
    other = await client.post("/v1/chat/completions", headers=USER,
                              json={**CHAT, "model": "b"})
    assert other.is_success  # the same anonymous caller, another model


@pytest.mark.parametrize("said, advice", [
    ("This server does not support embeddings. Start it with `--embeddings`",
     "This server does not support embeddings. To turn this on, set `embeddings: true` in "
     "the model's manifest"),
    ("This server does not support reranking. Start it with `--reranking`",
     "To turn this on, set `reranking: true` in the model's manifest"),
    ("tools param requires --jinja flag", "(to fix it, give the model a chat template"),
    ("This server does not support slots action. Start it with `--slot-save-path`",
     "its manifest's `args`"),
])
def test_worker_advice_names_the_manifest_field_not_the_worker_flag(said, advice):
    from model_boss.backends.worker_errors import upstream_error

    error = upstream_error("a", 501, json.dumps({"error": {"message": said}}).encode())
    assert advice in error.message and "--" not in error.message
    assert error.status_code == 400


async def test_a_json_body_sent_as_curls_form_type_is_read_as_json(api):
    """``curl -d '{...}'`` without ``-H content-type``: llama.cpp's server reads it as JSON,
    and so does model-boss; a form that is no JSON stays refused."""
    client, _ = api
    form = {"content-type": "application/x-www-form-urlencoded", **USER}
    answer = await client.post("/v1/chat/completions", headers=form,
                               content=json.dumps(CHAT).encode())
    assert answer.status_code == 200, answer.text
    refused = await client.post("/v1/chat/completions", headers=form, content=b"model=a")
    assert refused.status_code == 400


MESSAGES = {"model": "a", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
OLLAMA_CHAT = {"model": "a", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def error_of(response) -> tuple[str, str]:
    """(message, type) of an error in OpenAI's, Anthropic's or Ollama's envelope."""
    body = response.json()
    if isinstance(body["error"], str):
        return body["error"], "ollama"
    return body["error"]["message"], "anthropic" if body.get("type") == "error" else "openai"


@pytest.mark.parametrize("path, body, envelope", [
    ("/v1/chat/completions", CHAT, "openai"),
    ("/v1/embeddings", {"model": "a", "input": "hi"}, "openai"),
    ("/v1/messages", MESSAGES, "anthropic"),
])
@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8",
                                          "application/octet-stream"])
async def test_a_json_body_of_another_content_type_is_told_its_content_type(
        api, path, body, envelope, content_type):
    """Not "must be a JSON object": the body may be one; its content type was wrong."""
    client, _ = api
    answer = await client.post(path, content=json.dumps(body).encode(),
                               headers={**USER, "content-type": content_type})
    assert answer.status_code == 400, answer.text
    message, shape = error_of(answer)
    assert shape == envelope
    assert message == f"Content-Type: {content_type}: send the body as application/json"
    if envelope == "openai":
        assert answer.json()["error"]["code"] == "invalid_content_type"
    sent_right = await client.post(path, json=body, headers=USER)
    assert sent_right.status_code == 200, sent_right.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/octet-stream"])
async def test_ollamas_routes_read_a_json_body_whatever_its_content_type(api, content_type):
    """Ollama's server reads the body as JSON whatever the header says, and its clients
    (and ``curl -d``) rely on it: so does model-boss on Ollama's routes."""
    client, _ = api
    headers = {**USER, **({"content-type": content_type} if content_type else {})}
    answer = await client.post("/api/chat", content=json.dumps(OLLAMA_CHAT).encode(),
                               headers=headers)
    assert answer.status_code == 200, answer.text
    not_an_object = await client.post("/api/chat", content=b"[1]", headers=headers)
    assert not_an_object.status_code == 400
    assert error_of(not_an_object) == ("request body must be a JSON object", "ollama")
