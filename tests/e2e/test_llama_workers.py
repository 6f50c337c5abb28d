"""The llama worker kinds end to end: native (llama.cpp's server through xllamacpp), binary
(an external ``llama-server``, here a fake that records its command line), llama-cpp-python
(skipped when not installed); continuous batching; workers answer only the coordinator."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest

pytestmark = pytest.mark.slow

ONE_GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]}
CHAT = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def worker_launch(pid: int) -> tuple[list[str], dict[str, str]]:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    env = dict(item.split("=", 1) for item in
               Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
    return argv, env


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def slot(server: ServerProcess, model: str) -> dict:
    return next(s for s in server.status()["slots"] if s["model"] == model)


def chat(server: ServerProcess, model: str, **extra) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=120,
                      json={"model": model, **CHAT, **extra})


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("workers"), ONE_GPU, [
        llama_manifest("smol-4", demo_gguf, parallel=4, ctx_size=2048),
        llama_manifest("smol-1", demo_gguf, parallel=1, vram_mb=400),
    ])
    srv.start()
    yield srv
    srv.stop()


def streamed_spans(server: ServerProcess, model: str, count: int) -> list[tuple[float, float]]:
    """``count`` streamed chats at once: (first token, last token) of each, monotonic."""
    spans: list[tuple[float, float]] = []
    body = {"model": model, "stream": True, "max_tokens": 48, "temperature": 0,
            "ignore_eos": True,  # every stream as long as the others (llama.cpp's own field)
            "messages": [{"role": "user", "content": "Write a long story about a cat."}],
            "x_keep_alive_s": -1}

    def one() -> None:
        arrivals = []
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=120) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    arrivals.append(time.monotonic())
        assert len(arrivals) >= 48  # one chunk a token: no stream ended early
        spans.append((arrivals[0], arrivals[-1]))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(spans) == count
    return spans


def test_native_worker_is_llama_cpp_server_with_its_flags(server):
    assert chat(server, "smol-4").status_code == 200
    s = slot(server, "smol-4")
    argv, env = worker_launch(s["pid"])
    assert argv[1:3] == ["-m", "workers.llama"]
    assert flag(argv, "--parallel") == "4" and flag(argv, "--ctx-size") == "2048"
    assert flag(argv, "--alias") == "smol-4" and s["parallel"] == 4


def test_parallel_4_runs_four_requests_at_once_on_one_worker(server):
    """Continuous batching: with ``parallel: 4`` all four streams are generating at one
    moment (the last to start starts before the first to finish ends); with ``parallel: 1``
    the coordinator runs them one after another."""
    chat(server, "smol-4")
    pid = slot(server, "smol-4")["pid"]
    spans = streamed_spans(server, "smol-4", 4)
    assert max(start for start, _ in spans) < min(end for _, end in spans)
    assert slot(server, "smol-4")["pid"] == pid  # one worker served them all

    chat(server, "smol-1")
    serial = sorted(streamed_spans(server, "smol-1", 2))
    assert serial[1][0] >= serial[0][1]  # the second began after the first ended


def test_worker_answers_only_the_coordinator(server):
    """The port is private: no key (or a wrong one) → 401; the key lives in the worker's
    environment, never in its argv."""
    chat(server, "smol-4")
    s = slot(server, "smol-4")
    argv, env = worker_launch(s["pid"])
    secret = env["LLAMA_API_KEY"]
    assert len(secret) >= 32 and not any(secret in part for part in argv)
    url = f"http://127.0.0.1:{s['port']}"
    for path in ("/v1/models", "/props", "/slots"):
        assert httpx.get(url + path).status_code == 401
    direct = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert direct.status_code == 401
    wrong = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60,
                       headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401
    right = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60,
                       headers={"Authorization": f"Bearer {secret}"})
    assert right.status_code == 200


def test_each_start_gets_a_fresh_secret(server):
    chat(server, "smol-1")
    first = worker_launch(slot(server, "smol-1")["pid"])[1]["LLAMA_API_KEY"]
    assert httpx.post(server.url + "/api/v1/models/smol-1/unload", timeout=60).status_code < 300
    chat(server, "smol-1")
    second = worker_launch(slot(server, "smol-1")["pid"])[1]["LLAMA_API_KEY"]
    assert first != second


FAKE_LLAMA_SERVER = '''#!{python}
"""A fake llama-server: records its argv and environment, serves /health and chat."""
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
record = {{"argv": argv, "key_in_env": bool(os.environ.get("LLAMA_API_KEY")),
          "authorized": []}}
out = {record_path!r}

def save():  # whole or not at all: the test may read it while a request is being served
    part = out + ".%d.part" % threading.get_ident()  # one per serving thread
    with open(part, "w") as handle:
        json.dump(record, handle)
    os.replace(part, out)

save()

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        ok = self.headers.get("authorization") == "Bearer " + os.environ["LLAMA_API_KEY"]
        record["authorized"].append([self.path, ok])
        save()
        return ok

    def do_GET(self):
        if self.path == "/health":
            return self.answer(200, {{"status": "ok"}})
        if not self.authorized():
            return self.answer(401, {{"error": {{"message": "Invalid API Key"}}}})
        self.answer(404, {{"error": {{"message": "not here"}}}})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if not self.authorized():
            return self.answer(401, {{"error": {{"message": "Invalid API Key"}}}})
        self.answer(200, {{"id": "x", "object": "chat.completion", "created": 0,
                          "model": "fake", "choices": [{{"index": 0, "finish_reason": "stop",
                          "message": {{"role": "assistant", "content": "fake"}}}}]}})

port = int(argv[argv.index("--port") + 1])
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def test_binary_worker_gets_the_manifest_as_llama_server_flags(make_server, demo_gguf,
                                                               tmp_path):
    record = tmp_path / "argv.json"
    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable, record_path=str(record)))
    binary.chmod(0o755)
    two_small_gpus = [{"index": i, "name": f"sim-{i}", "vram_mb": 712} for i in (0, 1)]
    server = make_server({"gpus": two_small_gpus, "llama_server_binary": str(binary)}, [
        llama_manifest("fake", demo_gguf, worker="binary", vram_mb=300, ctx_size=4096,
                       parallel=3, main_gpu=1, threads=2, flash_attn="on",
                       cache_type_k="q8_0", cache_type_v="q4_0", chat_template="llama3",
                       embeddings=True, args=["--no-warmup"])])
    answer = chat(server, "fake")
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "fake"
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    assert flag(argv, "--model") == str(demo_gguf)
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--ctx-size") == "4096" and flag(argv, "--parallel") == "3"
    assert flag(argv, "--n-gpu-layers") == "999"  # the whole model, split across both GPUs
    split = [float(r) for r in flag(argv, "--tensor-split").split(",")]
    assert len(split) == 2 and abs(sum(split) - 1) < 0.01
    assert flag(argv, "--main-gpu") == "1" and flag(argv, "--threads") == "2"
    assert flag(argv, "--flash-attn") == "on"
    assert flag(argv, "--cache-type-k") == "q8_0" and flag(argv, "--cache-type-v") == "q4_0"
    assert flag(argv, "--chat-template") == "llama3"
    assert "--embeddings" in argv and "--reranking" not in argv
    assert flag(argv, "--alias") == "fake" and "--metrics" in argv
    assert argv[-1] == "--no-warmup"  # manifest args last
    # the secret: in the environment, not in argv, and sent on every call
    assert seen["key_in_env"] and "--api-key" not in argv
    assert seen["authorized"] and all(ok for _, ok in seen["authorized"])
    assert worker_launch(slot(server, "fake")["pid"])[1]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_binary_worker_missing_binary_fails_the_load_clearly(make_server, demo_gguf, tmp_path):
    server = make_server({"llama_server_binary": str(tmp_path / "no-such-llama-server")},
                         [llama_manifest("nobin", demo_gguf, worker="binary", vram_mb=300)])
    answer = chat(server, "nobin")
    assert answer.status_code == 503
    assert "llama-server binary not found" in answer.json()["error"]["message"]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="worker: llama-cpp-python needs the optional llama-cpp-python extra "
                           "(pip install -e '.[llama-cpp-python]')")
def test_llama_cpp_python_worker_serves_chat_behind_its_key(make_server, demo_gguf):
    server = make_server(ONE_GPU, [llama_manifest("lcp", demo_gguf, worker="llama-cpp-python",
                                                  vram_mb=400)])
    answer = chat(server, "lcp")
    assert answer.status_code == 200, answer.text
    s = slot(server, "lcp")
    argv, env = worker_launch(s["pid"])
    assert argv[1:3] == ["-m", "llama_cpp.server"] and env["API_KEY"]
    assert not any(env["API_KEY"] in part for part in argv)
    url = f"http://127.0.0.1:{s['port']}"
    assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60).status_code == 401
