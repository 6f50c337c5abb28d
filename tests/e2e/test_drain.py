"""A stop that drains (docs/FAULTS.md#stopping), on real coordinators, through the official
``openai``, ``anthropic`` and ``ollama`` clients, streaming and not.

Cloud manifests behind ``tests/fake_upstream.py`` give streams of a known length (the remote
paces its chunks); the demo model on real llama.cpp workers, with a Redis lease store, shows
that a stop leaves no worker, no lease and no half-written prompt cache file. SIGTERM while
requests run: within ``shutdown_grace_s`` they finish whole; new ones (and ``/health``) get
503 with ``Retry-After`` in their API's envelope; past the grace, or on a second signal, a
stream ends with its API's error event and terminator, never a broken connection."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisServer, ServerProcess, llama_manifest, pid_alive, wait_for
from tests.e2e.test_cloud_backend import KEY, cloud, start_upstream
from tests.lazy_modules import lazy

anthropic = lazy("anthropic")
ollama = lazy("ollama")
openai = lazy("openai")

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]
SHORT = 50  # chunks of a stream that ends within the grace (0.1 s apart)
MEDIUM = 40  # chunks of the one that keeps the drain going a while (0.2 s apart)


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, int]]:
    """Fake remotes: a short stream (5 s), a medium one (8 s), a long one (a minute), a
    whole answer after 5 s, and one that never answers in time."""
    flags = {"short": ("--chunks", str(SHORT), "--chunk-delay-ms", "100"),
             "medium": ("--chunks", str(MEDIUM), "--chunk-delay-ms", "200"),
             "long": ("--chunks", "1200", "--chunk-delay-ms", "50"),
             "late": ("--chunks", "3", "--answer-delay-ms", "5000"),
             "stuck": ("--chunks", "3", "--answer-delay-ms", "120000")}
    started: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        for name, args in flags.items():
            started[name] = start_upstream("--require-key", KEY, *args)
        yield {name: port for name, (_, port) in started.items()}
    finally:
        for proc, _ in started.values():
            proc.terminate()  # a remote still sending to a coordinator gone waits on it:
        for proc, _ in started.values():  # then it is killed
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def cloud_server(workdir: Path, upstreams: dict[str, int], grace_s: float,
                 **config) -> ServerProcess:
    manifests = [cloud(name, port, parallel=16) for name, port in upstreams.items()]
    return ServerProcess(workdir, {"shutdown_grace_s": grace_s, **config}, manifests,
                         env={"FAKE_UPSTREAM_KEY": KEY}).start()


# -- the calls, each as a user of its client makes it -------------------------------------


def openai_call(url: str, model: str, stream: bool, began: threading.Event) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    if not stream:
        began.set()
        answer = client.chat.completions.create(model=model, messages=HI)
        return answer.choices[0].message.content
    text = ""
    for chunk in client.chat.completions.create(model=model, messages=HI, stream=True):
        began.set()
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    return text


def anthropic_call(url: str, model: str, stream: bool, began: threading.Event) -> str:
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)
    if not stream:
        began.set()
        return client.messages.create(model=model, max_tokens=64, messages=HI).content[0].text
    text = ""
    with client.messages.stream(model=model, max_tokens=4000, messages=HI) as events:
        for piece in events.text_stream:
            began.set()
            text += piece
    return text


def ollama_call(url: str, model: str, stream: bool, began: threading.Event) -> str:
    client = ollama.Client(host=url, timeout=120)
    if not stream:
        began.set()
        return client.chat(model=model, messages=HI, stream=False).message.content
    text = ""
    for part in client.chat(model=model, messages=HI, stream=True):
        began.set()
        text += part.message.content or ""
    return text


CLIENTS: dict[str, Callable[[str, str, bool, threading.Event], str]] = {
    "openai": openai_call, "anthropic": anthropic_call, "ollama": ollama_call}
# a request's path and body on each API, for the raw checks
RAW = {"openai": ("/v1/chat/completions", {"messages": HI}),
       "anthropic": ("/v1/messages", {"max_tokens": 4000, "messages": HI}),
       "ollama": ("/api/chat", {"messages": HI})}


def raw_stream(url: str, api: str, model: str, began: threading.Event) -> tuple[int, str]:
    """A stream read as bytes (the terminator, which the clients hide, is seen here)."""
    path, body = RAW[api]
    text = ""
    with httpx.stream("POST", url + path, json={**body, "model": model, "stream": True},
                      headers={"anthropic-version": "2023-06-01"}, timeout=120) as answer:
        for piece in answer.iter_text():
            began.set()
            text += piece
    return answer.status_code, text


def running(server: ServerProcess) -> int:
    return sum(slot["active_requests"] for slot in server.status()["slots"])


def signal_and_time(server: ServerProcess, sig: int = signal.SIGTERM) -> float:
    server.proc.send_signal(sig)
    return time.monotonic()


def exited(server: ServerProcess, since: float, timeout: float, what: str) -> float:
    """Wait for the coordinator to exit with status 0; the seconds since ``since`` (a
    signal), printed for the record (``pytest -s``)."""
    assert server.proc.wait(timeout) == 0, server.log()
    took = round(time.monotonic() - since, 2)
    print(f"drain timing: {what}: {took:.2f} s")
    return took


def clean_log(server: ServerProcess) -> str:
    log = server.log_path.read_text(errors="replace")
    for wrong in ("Traceback", "CancelledError", "timeout graceful shutdown exceeded",
                  "Exception in ASGI application"):
        assert wrong not in log, log[-4000:]
    return log


def check_refusals(url: str) -> None:
    """New requests during the drain: 503 with Retry-After in each API's envelope, and each
    client raises its status error; /health says it drains."""
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 503 and health.headers["retry-after"]
    assert health.json()["status"] == "draining"
    assert health.json()["draining"]["grace_s"] > 0
    for api, (path, body) in RAW.items():
        answer = httpx.post(url + path, json={**body, "model": "short"}, timeout=10)
        assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1, api
        error = answer.json()
        if api == "openai":
            assert error["error"]["code"] == "shutting_down"
        elif api == "anthropic":
            assert error["type"] == "error" and "shutting down" in error["error"]["message"]
        else:
            assert "shutting down" in error["error"]
    with pytest.raises(openai.APIStatusError) as refused:
        openai_call(url, "short", False, threading.Event())
    assert refused.value.status_code == 503
    with pytest.raises(anthropic.APIStatusError) as refused_a:
        anthropic_call(url, "short", True, threading.Event())
    assert refused_a.value.status_code == 503
    with pytest.raises(ollama.ResponseError) as refused_o:
        ollama_call(url, "short", True, threading.Event())
    assert refused_o.value.status_code == 503


def start_all(pool: ThreadPoolExecutor, calls: dict[str, Callable[[threading.Event], object]]
              ) -> tuple[dict[str, Future], dict[str, threading.Event]]:
    """Start every call at once (the clients imported first: an import of seconds in one
    thread would start its call after the others had ended)."""
    for client in (openai.OpenAI, anthropic.Anthropic, ollama.Client):
        assert client
    began = {name: threading.Event() for name in calls}
    futures = {name: pool.submit(call, began[name]) for name, call in calls.items()}
    return futures, began


def test_within_the_grace_running_requests_finish_and_new_ones_are_refused(upstreams,
                                                                           tmp_path):
    server = cloud_server(tmp_path, upstreams, grace_s=60)
    url = server.url
    calls: dict[str, Callable[[threading.Event], object]] = {}
    for api, call in CLIENTS.items():
        calls[f"{api} stream"] = lambda began, call=call: call(url, "short", True, began)
        calls[f"{api} whole"] = lambda began, call=call: call(url, "late", False, began)
    calls["raw medium"] = lambda began: raw_stream(url, "openai", "medium", began)
    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            futures, began = start_all(pool, calls)
            wait_for(lambda: all(event.is_set() for event in began.values()), timeout=60)
            wait_for(lambda: running(server) == len(calls), timeout=60,
                     what=lambda: server.status()["slots"])
            sent = signal_and_time(server)
            check_refusals(url)
            answers = {name: future.result(timeout=90) for name, future in futures.items()}
        exited(server, sent, 60, "every request finished within the grace")
    finally:
        server.stop()
    whole_text = "".join(f"part{i} " for i in range(SHORT))
    for api in CLIENTS:
        assert answers[f"{api} stream"] == whole_text, api
        assert answers[f"{api} whole"] == "echo: hi", api
    status, raw = answers["raw medium"]
    assert status == 200 and raw.count('"content":"part') == MEDIUM
    assert raw.rstrip().endswith("data: [DONE]") and '"error"' not in raw
    log = clean_log(server)
    assert "every request finished" in log


def test_past_the_grace_each_stream_ends_with_its_apis_error(upstreams, tmp_path):
    server = cloud_server(tmp_path, upstreams, grace_s=2)
    url = server.url
    calls: dict[str, Callable[[threading.Event], object]] = {}
    for api, call in CLIENTS.items():
        calls[f"{api} stream"] = lambda began, call=call: call(url, "long", True, began)
        calls[f"{api} whole"] = lambda began, call=call: call(url, "stuck", False, began)
        calls[f"{api} raw"] = lambda began, api=api: raw_stream(url, api, "long", began)
    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            futures, began = start_all(pool, calls)
            wait_for(lambda: all(event.is_set() for event in began.values()), timeout=60)
            wait_for(lambda: running(server) == len(calls), timeout=60,
                     what=lambda: server.status()["slots"])
            sent = signal_and_time(server)
            failures = {}
            for name, future in futures.items():
                try:
                    failures[name] = future.result(timeout=60)
                except Exception as exc:  # each client's own error: what a user sees
                    failures[name] = exc
        exited(server, sent, 60, "grace of 2 s, then cut")
    finally:
        server.stop()
    # the clients raise their API's error, not a connection error
    assert isinstance(failures["openai stream"], openai.APIError)
    assert not isinstance(failures["openai stream"], openai.APIConnectionError)
    assert "shutting down" in str(failures["openai stream"])
    assert isinstance(failures["anthropic stream"], anthropic.APIStatusError)
    assert "shutting down" in str(failures["anthropic stream"])
    assert isinstance(failures["ollama stream"], ollama.ResponseError)
    assert "shutting down" in str(failures["ollama stream"])
    assert failures["openai whole"].status_code == 503
    assert failures["anthropic whole"].status_code == 503
    assert failures["ollama whole"].status_code == 503
    # the bytes: each API's error event and terminator, after text that did arrive
    status, text = failures["openai raw"]
    events = [line.removeprefix("data: ") for line in text.splitlines()
              if line.startswith("data: ")]
    assert status == 200 and '"part0 "' in text
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    assert events[-1] == "[DONE]"
    status, text = failures["anthropic raw"]
    last = text.strip().split("\n\n")[-1].splitlines()
    assert status == 200 and last[0] == "event: error", text[-500:]
    assert json.loads(last[1].removeprefix("data: "))["type"] == "error"
    status, text = failures["ollama raw"]
    lines = text.strip().splitlines()
    assert status == 200 and "shutting down" in json.loads(lines[-1])["error"]
    assert '"part0 "' in text
    log = clean_log(server)
    assert "request(s) cut" in log


def test_a_second_signal_stops_at_once(upstreams, tmp_path):
    server = cloud_server(tmp_path, upstreams, grace_s=120)
    url = server.url
    calls = {"raw": lambda began: raw_stream(url, "openai", "long", began),
             "anthropic": lambda began: anthropic_call(url, "long", True, began)}
    try:
        with ThreadPoolExecutor(2) as pool:
            futures, began = start_all(pool, calls)
            wait_for(lambda: all(event.is_set() for event in began.values()), timeout=60)
            signal_and_time(server)
            wait_for(lambda: httpx.get(url + "/health", timeout=5).status_code == 503)
            again = signal_and_time(server, signal.SIGINT)
            took = exited(server, again, 30, "second signal")
            status, text = futures["raw"].result(timeout=10)
            with pytest.raises(anthropic.APIStatusError, match="shutting down"):
                futures["anthropic"].result(timeout=10)
    finally:
        server.stop()
    assert took < 5
    assert status == 200 and text.rstrip().endswith("data: [DONE]")
    assert "a second signal" in text
    log = clean_log(server)
    assert "SIGINT again: stopping at once" in log


# -- real workers: nothing left running, no lease, no half-written prompt cache -------------


@pytest.fixture
def redis_store(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("drain-redis"))
    try:
        yield server.start()
    finally:
        server.stop()


def llama_server(workdir: Path, demo_gguf: Path, redis: RedisServer,
                 grace_s: float) -> ServerProcess:
    return ServerProcess(workdir, {"shutdown_grace_s": grace_s, "redis_url": redis.url,
                                   "prompt_cache_min_tokens": 8},
                         [llama_manifest("smol", demo_gguf)]).start()


def leases_of(redis: RedisServer, pid: int) -> list[dict]:
    import redis as redis_client

    client = redis_client.Redis.from_url(redis.url)
    try:
        leases = [json.loads(raw) for raw in client.hgetall("model-boss:leases").values()]
    finally:
        client.close()
    return [lease for lease in leases if str(lease.get("holder", "")).endswith(f":{pid}")]


def nothing_left(server: ServerProcess, redis: RedisServer, coordinator: int,
                 worker: int) -> list[Path]:
    """No worker process, no pid file, no lease; the prompt cache's files, none half
    written."""
    assert not pid_alive(worker)
    assert list((server.workdir / "state" / "workers").glob("*.json")) == []
    assert leases_of(redis, coordinator) == []
    files = sorted((server.workdir / "state" / "prompt-cache").rglob("*.*"))
    assert not [f for f in files if f.suffix in (".partial", ".tmp")], files
    return files


def llama_stream(url: str, max_tokens: int, began: threading.Event) -> tuple[str, str | None]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    text, finish = "", None
    for chunk in client.chat.completions.create(
            model="smol", messages=HI, stream=True, max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True}):
        began.set()
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.redis
def test_a_stop_during_a_llama_stream_saves_its_cache_and_leaves_nothing(
        demo_gguf, redis_store, tmp_path):
    server = llama_server(tmp_path, demo_gguf, redis_store, grace_s=60)
    coordinator = server.proc.pid
    try:
        with ThreadPoolExecutor(1) as pool:
            began = threading.Event()
            stream = pool.submit(llama_stream, server.url, 48, began)
            wait_for(began.is_set, timeout=120)
            worker = server.status()["slots"][0]["pid"]
            assert leases_of(redis_store, coordinator)  # held while it runs
            sent = signal_and_time(server)
            text, finish = stream.result(timeout=120)
        exited(server, sent, 90, "llama stream finished, prompt cache saved")
    finally:
        server.stop()
    assert finish == "length" and text
    files = nothing_left(server, redis_store, coordinator, worker)
    saved = [f for f in files if f.suffix == ".bin"]
    assert saved and all(f.with_suffix(".json").exists() for f in saved)
    clean_log(server)


@pytest.mark.redis
def test_a_second_signal_during_a_llama_stream_leaves_nothing(demo_gguf, redis_store,
                                                              tmp_path):
    server = llama_server(tmp_path, demo_gguf, redis_store, grace_s=120)
    coordinator = server.proc.pid
    try:
        with ThreadPoolExecutor(1) as pool:
            began = threading.Event()
            stream = pool.submit(llama_stream, server.url, 900, began)
            wait_for(began.is_set, timeout=120)
            worker = server.status()["slots"][0]["pid"]
            signal_and_time(server)
            wait_for(lambda: httpx.get(server.url + "/health", timeout=5).status_code == 503)
            again = signal_and_time(server)
            took = exited(server, again, 30, "llama, second signal")
            with pytest.raises(openai.APIError, match="shutting down"):
                stream.result(timeout=10)
    finally:
        server.stop()
    assert took < 5
    nothing_left(server, redis_store, coordinator, worker)
    clean_log(server)


# -- a cluster member that stops -----------------------------------------------------------


@pytest.mark.redis
def test_a_member_that_stops_hands_its_queued_request_to_another(upstreams, redis_store,
                                                                 tmp_path):
    """On b, one request streams and a second waits behind it (one at a time): SIGTERM to b
    hands the waiting one to a, which answers it; the running stream ends whole on b."""
    manifests = [cloud("one", upstreams["medium"], parallel=1)]
    members = {host: ServerProcess(
        tmp_path / host, {"redis_url": redis_store.url, "cluster": True, "host_id": host,
                          "cluster_heartbeat_s": 0.5, "cluster_member_ttl_s": 4.0,
                          "shutdown_grace_s": 60},
        manifests, env={"FAKE_UPSTREAM_KEY": KEY, "MODEL_BOSS_CLUSTER_SECRET": "drain-s"})
        for host in "ab"}
    try:
        for member in members.values():
            member.start(60)
        a, b = members["a"], members["b"]

        def view(server: ServerProcess) -> set[str]:
            answer = httpx.get(server.url + "/api/v1/cluster", timeout=10).json()
            return {m["host_id"] for m in answer["members"]}

        wait_for(lambda: view(a) == view(b) == {"a", "b"}, timeout=20)
        with ThreadPoolExecutor(2) as pool:
            began = threading.Event()
            first = pool.submit(raw_stream, b.url, "openai", "one", began)
            wait_for(began.is_set, timeout=60)
            second = pool.submit(httpx.post, b.url + "/v1/chat/completions", timeout=60,
                                 json={"model": "one", "messages": HI})
            wait_for(lambda: httpx.get(b.url + "/api/v1/queue", timeout=5).json()["total"]
                     == 1, timeout=30)
            sent = signal_and_time(b)
            handed = second.result(timeout=60)
            status, text = first.result(timeout=90)
        exited(b, sent, 60, "member: queued request handed off, stream finished")
        assert handed.status_code == 200, handed.text
        assert handed.headers["x-model-boss-member"] == "a"
        assert status == 200 and text.count('"content":"part') == MEDIUM
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        assert "handed_off" in clean_log(b)
        wait_for(lambda: view(a) == {"a"}, timeout=10)
    finally:
        for member in members.values():
            member.stop()

