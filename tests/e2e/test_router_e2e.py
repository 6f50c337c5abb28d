"""Tasks, fallbacks, templates, profiles and runtime config against real SmolLM2 workers."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow

TASKS = """
tasks:
  ladder:
    candidates: [ghost, smol-a, smol-b]
  pinned-ladder:
    candidates: [ghost, smol-b]
    pin_primary: true
  warm-pick:
    candidates: [smol-a, smol-b]
  tuned:
    candidates: [smol-a]
    params: {max_tokens: 3}
    priority: 1
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    workdir = tmp_path_factory.mktemp("router")
    (workdir / "tasks.yaml").write_text(TASKS)
    manifests = [
        {"id": "ghost", "backend": "llama-server", "path": "/nonexistent/ghost.gguf"},
        llama_manifest("smol-a", demo_gguf),
        llama_manifest("smol-b", demo_gguf),
        llama_manifest("smol-alpaca", demo_gguf, chat_template="alpaca"),
    ]
    config = {"tasks_file": str(workdir / "tasks.yaml"),
              "clients": {"kiosk": {"allowed_models": ["smol-a"], "priority": 3}}}
    srv = ServerProcess(workdir, config, manifests).start()
    yield srv
    srv.stop()


def chat(server, model, **extra):
    body = {"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def events(server, kind):
    data = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    return [e for e in data if e["type"] == kind]


def test_missing_primary_is_skipped_for_the_next_candidate(server):
    response = chat(server, "task:ladder")
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-model"] == "smol-a"


def test_pinned_missing_primary_falls_back_with_event(server):
    response = chat(server, "anything", x_task="pinned-ladder")
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-model"] == "smol-b"
    fallbacks = events(server, "fallback")
    assert fallbacks and fallbacks[-1]["model"] == "ghost" and fallbacks[-1]["to"] == "smol-b"


def test_warm_second_candidate_beats_cold_first(server):
    assert chat(server, "smol-b").status_code == 200
    httpx.post(server.url + "/api/v1/models/smol-a/unload")
    response = chat(server, "task:warm-pick")
    assert response.headers["x-model-boss-model"] == "smol-b"


def test_task_params_are_defaults_under_the_request(server):
    response = chat(server, "task:tuned", max_tokens=None)
    usage = response.json()["usage"]
    assert usage["completion_tokens"] <= 3
    response = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "task:tuned", "max_tokens": 6,
        "messages": [{"role": "user", "content": "Tell me a story"}]})
    assert 3 < response.json()["usage"]["completion_tokens"] <= 6


def test_unknown_task_is_404(server):
    response = chat(server, "task:nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "task_not_found"


def test_alpaca_template_gets_a_real_completion(server):
    # Greedy decoding: a sampled reply may be one word ("apple") and end, which would say
    # nothing about whether the stream streams.
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    ask = {"model": "smol-alpaca", "max_tokens": 12, "temperature": 0,
           "messages": [{"role": "user", "content": "List five fruits, one per line."}]}
    reply = client.chat.completions.create(**ask)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content.strip()
    stream = client.chat.completions.create(stream=True, **ask)
    pieces = [c.choices[0].delta.content for c in stream
              if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2, pieces
    assert "".join(pieces) == reply.choices[0].message.content, (pieces, reply)


def test_thinking_flag_is_accepted(server):
    assert chat(server, "smol-a", x_thinking=False).status_code == 200
    assert chat(server, "smol-a", x_thinking="maybe").status_code == 400


def test_profile_restricts_models(server):
    assert chat(server, "smol-a", x_client_id="kiosk").status_code == 200
    denied = chat(server, "smol-b", x_client_id="kiosk")
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "model_not_allowed"
    assert chat(server, "task:warm-pick", x_client_id="kiosk").headers[
        "x-model-boss-model"] == "smol-a"


def test_runtime_config_validation(server):
    assert httpx.get(server.url + "/api/v1/config").json() == {"allowCloudFallback": True}
    bad = httpx.put(server.url + "/api/v1/config", json={"allowCloudFallback": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "allowCloudFallback"


def test_runtime_config_survives_restart(tmp_path, demo_gguf):
    manifests = [llama_manifest("smol", demo_gguf)]
    first = ServerProcess(tmp_path, {}, manifests).start()
    try:
        put = httpx.put(first.url + "/api/v1/config", json={"allowCloudFallback": False})
        assert put.json() == {"allowCloudFallback": False}
    finally:
        first.stop()
    second = ServerProcess(tmp_path, {}, manifests).start()
    try:
        assert httpx.get(second.url + "/api/v1/config").json() == {
            "allowCloudFallback": False}
    finally:
        second.stop()
