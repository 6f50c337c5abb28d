"""What a client written for llama.cpp's own server sees through model-boss, as against the
bare server: CORS for browser pages, ``GET /slots``, a disconnect that frees the slot on every
route, ``/completions`` in the native shape, llama.cpp's own error types, ``x-api-key`` on
every route, and OpenAI bodies whose fields have the wrong type refused by name."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for

pytestmark = pytest.mark.slow

KEY = "parity-key"
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(demo_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("parity"),
                            {"api_key": KEY,
                             "gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
                            [llama_manifest("smol", demo_gguf),
                             llama_manifest("smol-short", demo_gguf, ctx_size=256)],
                            headers={"x-api-key": KEY})
    process.start()
    try:
        yield process
    finally:
        process.stop()


def slots(server: ServerProcess, model: str = "smol") -> list[dict]:
    answer = server.client().get("/slots", params={"model": model})
    assert answer.status_code == 200, answer.text
    return answer.json()


# --- x-api-key and bodies ------------------------------------------------------------------

@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "smol", "messages": HI, "max_tokens": 2}),
    ("/completion", {"model": "smol", "prompt": "Hi", "n_predict": 2}),
    ("/api/chat", {"model": "smol", "messages": HI, "stream": False,
                   "options": {"num_predict": 2}}),
    ("/v1/messages", {"model": "smol", "messages": HI, "max_tokens": 2}),
])
def test_x_api_key_is_the_key_on_every_route(server: ServerProcess, path: str,
                                             body: dict) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as http:
        assert http.post(path, json=body, headers={"x-api-key": KEY}).status_code == 200
        assert http.post(path, json=body, headers={"x-api-key": "wrong"}).status_code == 401


@pytest.mark.parametrize("field, value", [("max_tokens", "10"), ("temperature", "0.5"),
                                          ("n", True), ("stream", "yes")])
def test_a_field_of_the_wrong_type_is_a_400_naming_it(server: ServerProcess, field: str,
                                                      value) -> None:
    answer = server.client().post("/v1/chat/completions",
                                  json={"model": "smol", "messages": HI, field: value})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and field in error["message"]


# --- /completions in llama.cpp's shape ----------------------------------------------------

def test_completions_without_v1_is_the_native_shape(server: ServerProcess) -> None:
    with server.client() as http:
        native = http.post("/completions", json={"model": "smol", "prompt": "Hi",
                                                 "n_predict": 3}).json()
        openai = http.post("/v1/completions", json={"model": "smol", "prompt": "Hi",
                                                    "max_tokens": 3}).json()
    assert "content" in native and native["tokens_predicted"] <= 3 and "choices" not in native
    assert openai["object"] == "text_completion" and openai["choices"][0]["text"] is not None


def test_whole_answers_gathered_from_a_stream(server: ServerProcess) -> None:
    """A non-streamed Responses call and text completion with logprobs are asked as streams
    (so a disconnect stops them) and answer the whole body all the same."""
    with server.client() as http:
        text = http.post("/v1/completions", json={"model": "smol", "prompt": "Hi",
                                                  "max_tokens": 3, "logprobs": 2,
                                                  "temperature": 0}).json()
        response = http.post("/v1/responses", json={"model": "smol", "input": "Say hello.",
                                                    "max_output_tokens": 4}).json()
    choice = text["choices"][0]
    tokens = choice["logprobs"]["content"]
    assert len(tokens) == text["usage"]["completion_tokens"] <= 3
    assert "".join(t["token"] for t in tokens) == choice["text"]
    assert all(len(t["top_logprobs"]) == 2 for t in tokens)
    assert response["object"] == "response" and response["status"] == "completed"
    assert response["output"][-1]["content"][0]["text"]
    assert response["usage"]["output_tokens"] <= 4 and response["completed_at"]


# --- llama.cpp's own errors ----------------------------------------------------------------

def test_a_prompt_over_the_context_is_llamas_own_error(server: ServerProcess) -> None:
    answer = server.client().post("/v1/chat/completions", json={
        "model": "smol-short", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there " * 300}]})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["code"] == "context_length_exceeded"
    assert error["n_ctx"] <= 256 < error["n_prompt_tokens"]
    assert "/" not in error["message"]
    # what sets the context, where a person can change it (catalog/context.py)
    assert error["message"].endswith("'smol-short' runs with a context of 256 tokens, set by "
                                     "`ctx_size` in its manifest (smol-short.yaml)")


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_prompt_over_the_context_says_where_it_is_set(server: ServerProcess,
                                                                  stream: bool) -> None:
    answer = server.client().post("/v1/responses", json={
        "model": "smol-short", "max_output_tokens": 4, "stream": stream,
        "input": "hello there " * 300})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "runs with a context of 256 tokens, set by `ctx_size` in its manifest " \
           "(smol-short.yaml)" in error["message"]


# --- /slots, and a disconnect that frees the slot ------------------------------------------

def test_slots_of_a_model(server: ServerProcess) -> None:
    server.client().post("/completion", json={"model": "smol", "prompt": "Hi", "n_predict": 1})
    listed = slots(server)
    assert listed and all("is_processing" in slot and "n_ctx" in slot for slot in listed)
    assert not any(slot["is_processing"] for slot in listed)


def test_slots_of_a_model_not_loaded_is_a_409(server: ServerProcess) -> None:
    server.client().post("/api/v1/models/smol-short/unload")
    wait_for(lambda: server.client().get("/api/v1/models/smol-short/status").json()
             ["state"] == "idle", timeout=30)
    answer = server.client().get("/slots", params={"model": "smol-short"})
    assert answer.status_code == 409 and "not loaded" in answer.json()["error"]["message"]


def answered(sock: socket.socket) -> bytes:
    """What the server has written back so far (for a failure's message)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


LONG = {"n_predict": 1500, "max_tokens": 1500, "ignore_eos": True}
# llama.cpp's own /v1/messages drops ``ignore_eos``: asked to say hello, the demo model ends
# its answer after about 24 tokens, often before a client can leave; asked to count, it goes on
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]


@pytest.mark.parametrize("path, body", [
    ("/completion", {"prompt": "Count to a thousand:"}),
    ("/v1/chat/completions", {"messages": HI}),
    ("/v1/chat/completions", {"messages": HI, "stream": True}),
    ("/v1/messages", {"messages": COUNT}),
    ("/v1/messages", {"messages": COUNT, "stream": True}),
    ("/v1/responses", {"input": "Count to a thousand:", "max_output_tokens": 1500}),
    ("/v1/completions", {"prompt": "Count to a thousand:", "logprobs": 2}),
    ("/api/generate", {"prompt": "Count:", "stream": True, "options": {"num_predict": 1500}}),
])
def test_a_client_that_goes_away_frees_its_slot(server: ServerProcess, path: str,
                                                body: dict) -> None:
    assert server.client().post("/api/v1/models/smol/load").status_code == 200
    wait_for(lambda: not any(s["is_processing"] for s in slots(server)), timeout=10)  # idle
    payload = orjson.dumps({"model": "smol", **LONG, **body})
    if path.startswith("/api/"):
        payload = orjson.dumps({"model": "smol", **body})
    # an answer that ended by itself before the client could leave shows nothing: ask again
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {KEY}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                     "\r\n".encode() + payload)
        got = bytearray()

        def generating_or_ended(sock: socket.socket = sock, got: bytearray = got) -> bool:
            got.extend(answered(sock))
            if any(s["is_processing"] for s in slots(server)):
                return True
            status = server.client().get("/api/v1/models/smol/status").json()
            return bool(got) and status["active_requests"] == 0  # answered whole

        wait_for(generating_or_ended, timeout=60,
                 what=lambda got=got: (bytes(got),
                                       server.client().get("/api/v1/models/smol/status").json(),
                                       server.client().get("/api/v1/queue").json(),
                                       slots(server)))
        time.sleep(0.5)  # generating
        if any(s["is_processing"] for s in slots(server)):
            break
        sock.close()  # it ended by itself: nothing to show; again
    else:
        raise AssertionError("the answer ended within half a second in five tries")
    sock.close()
    gone = time.monotonic()
    wait_for(lambda: not any(s["is_processing"] for s in slots(server)), timeout=3,
             what=lambda: [(s["id"], s["is_processing"]) for s in slots(server)])
    print(f"{path} stream={body.get('stream')}: slot free {time.monotonic() - gone:.2f}s "
          "after the client went")


# --- CORS ----------------------------------------------------------------------------------

def test_preflight_and_headers_for_a_loopback_page(server: ServerProcess) -> None:
    origin = "http://localhost:5173"
    with httpx.Client(base_url=server.url, timeout=60) as http:
        preflight = http.options("/v1/chat/completions", headers={
            "origin": origin, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        refused = http.post("/v1/chat/completions", json={"model": "nope", "messages": HI},
                            headers={"origin": origin, "authorization": f"Bearer {KEY}"})
        assert refused.status_code == 404  # an error answer is readable by the page too
        assert refused.headers["access-control-allow-origin"] == origin
        other = http.options("/v1/chat/completions", headers={
            "origin": "http://evil.example.com", "access-control-request-method": "POST"})
        assert "access-control-allow-origin" not in other.headers


PAGE = """<!doctype html><title>client</title><script>
async function call(base, key) {
  const chat = await fetch(base + "/v1/chat/completions", {method: "POST",
    headers: {"authorization": "Bearer " + key, "content-type": "application/json"},
    body: JSON.stringify({model: "smol", max_tokens: 3,
                          messages: [{role: "user", content: "Hi"}]})});
  const message = await fetch(base + "/v1/messages", {method: "POST",
    headers: {"x-api-key": key, "anthropic-version": "2023-06-01",
              "content-type": "application/json"},
    body: JSON.stringify({model: "smol", max_tokens: 3,
                          messages: [{role: "user", content: "Hi"}]})});
  return {chat: chat.status, served_by: chat.headers.get("x-model-boss-model"),
          answer: (await chat.json()).choices[0].message.role,
          message: (await message.json()).type};
}
</script>"""


@pytest.fixture
def page_server() -> Iterator[str]:
    """The page above, served from another loopback port."""
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(PAGE.encode())

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()


def test_a_browser_page_on_another_port_calls_the_api(server: ServerProcess,
                                                      page_server: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.e2e.test_dashboard import CHROMIUM

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page()
            page.goto(page_server)
            result = page.evaluate("([base, key]) => call(base, key)", [server.url, KEY])
        finally:
            browser.close()
    assert result == {"chat": 200, "served_by": "smol", "answer": "assistant",
                      "message": "message"}
