"""Keys as tenants and the usage ledger against real processes, as it must hold.

1. Three managed keys with different scopes, rates and quotas, driven through the official
   ``openai``, ``anthropic`` and ``ollama`` clients against a coordinator serving the demo
   llama.cpp model under two names: each key sees only its models, each is stopped with the
   right 429 in each client's error class, and ``GET /api/v1/usage`` matches, token for
   token, what the clients were told (streams and whole answers); the GPU-seconds less the
   loads are the slots' busy time, within the requests' own durations.
2. "Nothing lost": 1,000 mixed requests of three keys through ``command`` workers
   (``tests/fake_upstream.py``, real processes that count the prompt's words as tokens)
   while a worker (with two requests it is known to hold) and then the coordinator are
   SIGKILLed; the coordinator restarts on the same state folder and the run finishes. Every
   answer a client received is in the ledger with its figures, but for what a SIGKILLed
   coordinator had not written yet (said, and bounded to the last moments before the kill),
   and the requests the worker's death cut are rows with outcome ``failed``.

A cluster variant (two members, rows tagged by member) is not here: the in-process tests
cover the member column, and two more coordinators would double this file's time.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.lazy_modules import lazy

openai = lazy("openai")
anthropic = lazy("anthropic")
ollama = lazy("ollama")

pytestmark = pytest.mark.slow

ADMIN_KEY = "admin-e2e-secret"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]}
APIS = ("openai", "anthropic", "ollama")


def make_key(url: str, name: str, **terms: Any) -> str:
    """A managed key (the admin API); its secret."""
    answer = httpx.post(url + "/api/v1/keys", json={"name": name, **terms}, headers=ADMIN,
                        timeout=10)
    assert answer.status_code == 201, answer.text
    return answer.json()["key"]


def usage_rows(url: str, group_by: str, headers: dict[str, str] = ADMIN,
               fmt: str = "json") -> Any:
    answer = httpx.get(f"{url}/api/v1/usage", params={"group_by": group_by, "format": fmt},
                       headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.text if fmt == "csv" else answer.json()["rows"]


# -- 1. three keys through the official clients, on the demo model -------------------------


@dataclass
class Told:
    """What the clients of one key, API and model were told they used."""

    requests: int = 0
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    seconds: float = 0.0  # the calls' wall time, client side

    def add(self, prompt: int, completion: int, cached: int, seconds: float) -> None:
        self.requests += 1
        self.prompt += prompt
        self.completion += completion
        self.cached += cached
        self.seconds += seconds


@dataclass
class Tenant:
    """One key and its three official clients; each labels its requests with its API's
    name as the end user (``X-Client-Id`` under a key only names an end user)."""

    name: str
    secret: str
    url: str
    told: dict[tuple[str, str], Told] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.openai = openai.OpenAI(base_url=self.url + "/v1", api_key=self.secret,
                                    max_retries=0, timeout=120,
                                    default_headers={"x-client-id": "openai"})
        self.anthropic = anthropic.Anthropic(base_url=self.url, api_key=self.secret,
                                             max_retries=0, timeout=120,
                                             default_headers={"x-client-id": "anthropic"})
        self.ollama = ollama.Client(host=self.url, timeout=120, headers={
            "authorization": f"Bearer {self.secret}", "x-client-id": "ollama"})

    def models(self) -> dict[str, list[str]]:
        """The models each API lists for this key."""
        return {"openai": sorted(m.id for m in self.openai.models.list()),
                "anthropic": sorted(m.id for m in self.anthropic.models.list()),
                "ollama": sorted(m.model for m in self.ollama.list().models)}

    # each call: (prompt, completion, cached) tokens as its client was told them

    def openai_chat(self, model: str, text: str) -> tuple[int, int, int]:
        usage = self.openai.chat.completions.create(
            model=model, max_tokens=6, messages=[{"role": "user", "content": text}]).usage
        return usage.prompt_tokens, usage.completion_tokens, _cached(usage)

    def openai_stream(self, model: str, text: str) -> tuple[int, int, int]:
        usage = None
        for chunk in self.openai.chat.completions.create(
                model=model, max_tokens=6, stream=True, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": text}]):
            usage = chunk.usage or usage
        assert usage is not None
        return usage.prompt_tokens, usage.completion_tokens, _cached(usage)

    def openai_stream_bare(self, model: str, text: str) -> tuple[int, int, int]:
        """A stream that asks for no usage (the SDK's default): what it is told is
        llama.cpp's ``timings`` on its last chunk (tokens evaluated, taken from the prompt
        cache, predicted)."""
        timings = None
        for chunk in self.openai.chat.completions.create(
                model=model, max_tokens=6, stream=True,
                messages=[{"role": "user", "content": text}]):
            assert chunk.usage is None
            timings = (chunk.model_extra or {}).get("timings") or timings
        assert timings is not None
        return (timings["prompt_n"] + timings["cache_n"], timings["predicted_n"],
                timings["cache_n"])

    def anthropic_message(self, model: str, text: str) -> tuple[int, int, int]:
        usage = self.anthropic.messages.create(
            model=model, max_tokens=6, messages=[{"role": "user", "content": text}]).usage
        return _anthropic(usage)

    def anthropic_stream(self, model: str, text: str) -> tuple[int, int, int]:
        with self.anthropic.messages.stream(
                model=model, max_tokens=6,
                messages=[{"role": "user", "content": text}]) as stream:
            for _ in stream:
                pass
            return _anthropic(stream.get_final_message().usage)

    def ollama_chat(self, model: str, text: str) -> tuple[int, int, int]:
        answer = self.ollama.chat(model=model, options={"num_predict": 6},
                                  messages=[{"role": "user", "content": text}])
        return answer.prompt_eval_count, answer.eval_count, 0

    def ollama_stream(self, model: str, text: str) -> tuple[int, int, int]:
        last = None
        for part in self.ollama.chat(model=model, stream=True, options={"num_predict": 6},
                                     messages=[{"role": "user", "content": text}]):
            last = part
        assert last is not None and last.done
        return last.prompt_eval_count, last.eval_count, 0

    def calls(self) -> list[tuple[str, Callable[[str, str], tuple[int, int, int]]]]:
        return [("openai", self.openai_chat), ("openai", self.openai_stream),
                ("openai", self.openai_stream_bare), ("anthropic", self.anthropic_message),
                ("anthropic", self.anthropic_stream), ("ollama", self.ollama_chat),
                ("ollama", self.ollama_stream)]

    def spend_until_refused(self, models: list[str], most: int) -> tuple[int, Exception]:
        """Every kind of call in turn (the models in turn) until one is refused with 429;
        how many were served, and the refusal."""
        calls = self.calls()
        for i in range(most):
            api, call = calls[i % len(calls)]
            model = models[i % len(models)]
            started = time.perf_counter()
            try:
                prompt, completion, cached = call(model, f"Name {i + 2} colours.")
            except (openai.RateLimitError, anthropic.RateLimitError) as exc:
                return i, exc
            except ollama.ResponseError as exc:
                assert exc.status_code == 429, exc
                return i, exc
            took = time.perf_counter() - started
            self.told.setdefault((api, model), Told()).add(prompt, completion, cached, took)
        raise AssertionError(f"key {self.name} was never refused in {most} requests")

    def refusals(self, model: str) -> dict[str, Exception]:
        """The same request through each client, once the key is over its limit."""
        chat = [{"role": "user", "content": "hi"}]
        found: dict[str, Exception] = {}
        with pytest.raises(openai.RateLimitError) as by_openai:
            self.openai.chat.completions.create(model=model, max_tokens=2, messages=chat)
        found["openai"] = by_openai.value
        with pytest.raises(anthropic.RateLimitError) as by_anthropic:
            self.anthropic.messages.create(model=model, max_tokens=2, messages=chat)
        found["anthropic"] = by_anthropic.value
        with pytest.raises(ollama.ResponseError) as by_ollama:
            self.ollama.chat(model=model, messages=chat, options={"num_predict": 2})
        found["ollama"] = by_ollama.value
        return found


def _cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details is not None else 0


def _anthropic(usage: Any) -> tuple[int, int, int]:
    """Anthropic's input tokens leave out what was read from (or written to) the prompt
    cache; the prompt is all three (OpenAI's ``prompt_tokens`` includes the cached)."""
    read = usage.cache_read_input_tokens or 0
    prompt = usage.input_tokens + read + (usage.cache_creation_input_tokens or 0)
    return prompt, usage.output_tokens, read


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory, demo_gguf) -> Iterator[ServerProcess]:
    """One coordinator, the demo model under two names (two workers of the same file)."""
    server = ServerProcess(tmp_path_factory.mktemp("ledger-smol"),
                           {"admin_api_key": ADMIN_KEY, **GPU},
                           [llama_manifest("smol-a", demo_gguf),
                            llama_manifest("smol-b", demo_gguf)], headers=ADMIN)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_three_keys_through_the_official_clients(smol_server: ServerProcess):
    url = smol_server.url
    # alpha: one model and a rate of tokens; bravo: the other model and a daily quota of
    # tokens; charlie: both models and a rate of requests (every kind of call, then no more)
    alpha = Tenant("alpha", make_key(url, "alpha", models=["smol-a"],
                                     tokens_per_minute=300), url)
    bravo = Tenant("bravo", make_key(url, "bravo", models=["smol-b"], tokens_per_day=300,
                                     endpoints=["chat"]), url)
    charlie = Tenant("charlie", make_key(url, "charlie", models=["smol-*"],
                                         requests_per_minute=8), url)
    tenants = {"alpha": (alpha, ["smol-a"]), "bravo": (bravo, ["smol-b"]),
               "charlie": (charlie, ["smol-a", "smol-b"])}
    for tenant, models in tenants.values():
        assert tenant.models() == dict.fromkeys(APIS, models), tenant.name
    with pytest.raises(openai.NotFoundError) as hidden:
        alpha.openai.chat.completions.create(model="smol-b", max_tokens=2,
                                             messages=[{"role": "user", "content": "hi"}])
    assert hidden.value.code == "model_not_found"
    with pytest.raises(ollama.ResponseError) as hidden_too:
        bravo.ollama.chat(model="smol-a", messages=[{"role": "user", "content": "hi"}])
    assert hidden_too.value.status_code == 404

    served = {name: tenant.spend_until_refused(models, most=20)
              for name, (tenant, models) in tenants.items()}
    print("\nserved before the first 429:", {n: s for n, (s, _) in served.items()})
    assert served["charlie"][0] == 8  # its rate: 8 requests a minute, the 9th refused
    for name in ("alpha", "bravo"):  # token limits: a request starts while under them
        tokens = sum(t.prompt + t.completion for t in tenants[name][0].told.values())
        assert served[name][0] >= 4 and tokens >= 300, (name, served[name], tokens)
    for name, code, param in (("alpha", "rate_limited", None),
                              ("bravo", "quota_exceeded", "tokens_per_day"),
                              ("charlie", "rate_limited", None)):
        tenant, models = tenants[name]
        refused = tenant.refusals(models[0])
        by_openai, by_anthropic, by_ollama = (refused[api] for api in APIS)
        assert by_openai.code == code and by_openai.param == param, by_openai.body
        retry_after = float(by_openai.response.headers["retry-after"])
        assert 1 <= retry_after <= (86400 if param else 60), retry_after
        if param:
            assert param in str(by_openai) and "resets at" in str(by_openai)
        assert by_anthropic.body["error"]["type"] == "rate_limit_error"
        assert by_anthropic.response.headers["retry-after"]
        assert by_ollama.status_code == 429
        assert ("quota" if param else "rate") in by_ollama.error

    told: dict[tuple[str, str, str], Told] = {
        (name, api, model): one for name, (tenant, _) in tenants.items()
        for (api, model), one in tenant.told.items()}
    rows = {(r["key"], r["end_user"], r["model"]): r
            for r in usage_rows(url, "key,end_user,model")}
    assert set(rows) == set(told), (sorted(rows), sorted(told))
    for where, one in told.items():
        row = rows[where]
        assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
            one.requests, one.prompt, one.completion), (where, row, one)
        if where[1] != "ollama":  # Ollama's answers say nothing of the prompt cache
            assert row["cached_tokens"] == one.cached, (where, row, one)
    by_key = {r["key"]: r for r in usage_rows(url, "key")}
    for name, (tenant, _) in tenants.items():
        assert by_key[name]["prompt_tokens"] == sum(t.prompt for t in tenant.told.values())
    exported = list(csv.DictReader(io.StringIO(usage_rows(url, "key,model", fmt="csv"))))
    assert sum(int(r["completion_tokens"]) for r in exported) == sum(
        t.completion for t in told.values())
    own = usage_rows(url, "key", headers={"authorization": f"Bearer {alpha.secret}"})
    assert [r["key"] for r in own] == ["alpha"]  # a user key sees only its own rows

    # GPU-seconds: each slot's busy time shared among its requests, plus the loads; the
    # requests ran one at a time, so the busy time is within their durations, and most of it
    gpu = sum(r["gpu_seconds"] - r["load_seconds"] for r in rows.values())
    loads = sum(r["load_seconds"] for r in rows.values())
    durations = sum(t.seconds for t in told.values())
    print(f"gpu_seconds - load_seconds = {gpu:.3f}s; loads {loads:.2f}s; the requests' "
          f"durations {durations:.3f}s")
    assert loads > 0
    assert 0.5 * (durations - loads) < gpu <= durations


# -- 2. nothing lost: 1,000 requests, a worker SIGKILLed, then the coordinator -------------

REQUESTS = int(os.environ.get("MODEL_BOSS_LEDGER_REQUESTS", "1000"))
CONCURRENCY = 16
KILL_WORKER_AT = REQUESTS * 3 // 10  # requests finished when the chat worker is killed
KILL_COORDINATOR_AT = REQUESTS * 13 // 20  # ... and when the coordinator is
# rows the ledger had not written when its coordinator was SIGKILLed: at most those that
# finished this long before (it writes every 0.25 s; slack for a loaded box)
UNWRITTEN_WINDOW_S = 2.0
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
KINDS = ("chat", "chat-stream", "chat-stream-bare", "completion", "completion-stream",
         "embedding")
HOLD = "HOLD"  # a prompt with it stays in the chat worker (tests/fake_upstream.py --hold-*)
HELD = 2  # such requests sent when the worker is killed: it surely has them in hand


def fake_worker(model_id: str, category: str, *flags: str, parallel: int = 64) -> dict:
    """A ``command`` manifest: tests/fake_upstream.py, whose usage counts the prompt's words."""
    return {"id": model_id, "category": category, "backend": "command", "vram_mb": 100,
            "parallel": parallel, "health_path": "/v1/models",
            "command": [sys.executable, "-m", "tests.fake_upstream", "--port", "{port}",
                        "--count-words", *flags]}


@dataclass
class Sent:
    """One request of the run and what its client saw."""

    label: str  # its end user: one per request, so the ledger's rows can be matched
    key: str
    kind: str
    model: str
    words: int
    state: str = "pending"  # ok, failed (an error answer), cut (the coordinator died)
    prompt: int = 0
    completion: int = 0
    finished: float = 0.0  # time.monotonic() when its answer ended
    error: str = ""  # what a failed one was answered
    held: bool = False  # sent to be in the worker when it is killed

    def request(self) -> tuple[str, dict[str, Any]]:
        text = " ".join([HOLD] * self.held + WORDS[: self.words])
        stream = self.kind.endswith("stream") or self.kind == "chat-stream-bare"
        body: dict[str, Any] = {"model": self.model, "user": self.label, "max_tokens": 8}
        if stream:
            body["stream"] = True
            if not self.kind.endswith("bare"):
                body["stream_options"] = {"include_usage": True}
        if self.kind.startswith("chat"):
            return "/v1/chat/completions", {**body, "messages": [
                {"role": "user", "content": text}]}
        if self.kind.startswith("completion"):
            return "/v1/completions", {**body, "prompt": text}
        return "/v1/embeddings", {"model": self.model, "user": self.label,
                                  "input": text.split(maxsplit=1)}


def plan(keys: list[str]) -> list[Sent]:
    rng = random.Random(39)
    sent = []
    for i in range(REQUESTS):
        kind = rng.choice(KINDS)
        sent.append(Sent(f"r{i:04d}", rng.choice(keys), kind,
                         "fake-embed" if kind == "embedding" else "fake-chat",
                         rng.randint(1, len(WORDS))))
    return sent


class Run:
    """The load: CONCURRENCY clients taking the planned requests in turn; a worker kill and a
    coordinator kill (then its restart) when enough have finished."""

    def __init__(self, server: ServerProcess, secrets: dict[str, str],
                 planned: list[Sent], held_log: Path) -> None:
        self.server = server
        self.secrets = secrets
        self.held_log = held_log
        self.held = [Sent(f"held{i}", key, "chat", "fake-chat", 3, held=True)
                     for i, key in zip(range(HELD), secrets, strict=False)]
        self.planned = planned
        self.waiting = list(reversed(planned))
        self.done = 0
        self.open = asyncio.Event()  # closed from the coordinator's kill to its restart
        self.open.set()
        self.in_flight: set[str] = set()
        self.drained = asyncio.Event()  # set when the last request in flight at a kill ends
        self.in_flight_at_kill: list[str] = []
        self.coordinator_killed_at = 0.0
        self.client = self._client()
        self.reached: dict[int, asyncio.Event] = {}

    def _client(self) -> httpx.AsyncClient:
        most = CONCURRENCY + HELD + 1  # the clients, the held requests, a status
        return httpx.AsyncClient(base_url=self.server.url, timeout=60, limits=httpx.Limits(
            max_connections=most, max_keepalive_connections=most))

    async def when_done(self, count: int) -> None:
        if self.done < count:
            await self.reached.setdefault(count, asyncio.Event()).wait()

    async def one(self, sent: Sent) -> None:
        path, body = sent.request()
        headers = {"authorization": f"Bearer {self.secrets[sent.key]}"}
        self.in_flight.add(sent.label)
        try:
            if body.get("stream"):
                await self._stream(sent, path, body, headers)
            else:
                answer = await self.client.post(path, json=body, headers=headers)
                if answer.status_code == 200:
                    usage = answer.json()["usage"]
                    sent.prompt = usage["prompt_tokens"]
                    sent.completion = usage.get("completion_tokens", 0)
                    sent.state = "ok"
                else:
                    sent.state, sent.error = "failed", answer.text
        except httpx.TransportError as exc:
            if self.open.is_set():  # no kill of the coordinator explains it
                sent.state, sent.error = "broken", f"{type(exc).__name__} {exc} at {self.done}"
            else:
                sent.state = "cut"
        else:
            if sent.state == "unended" and not self.open.is_set():
                sent.state = "cut"  # a stream whose coordinator died under it
        finally:
            self.in_flight.discard(sent.label)
            if not self.in_flight and not self.open.is_set():
                self.drained.set()
        sent.finished = time.monotonic()

    async def _stream(self, sent: Sent, path: str, body: dict[str, Any],
                      headers: dict[str, str]) -> None:
        async with self.client.stream("POST", path, json=body, headers=headers) as answer:
            if answer.status_code != 200:
                sent.state, sent.error = "failed", (await answer.aread()).decode()
                return
            errored = ended = False
            async for line in answer.aiter_lines():
                if line == "data: [DONE]":
                    ended = True
                elif line.startswith("data: "):
                    event = orjson.loads(line[6:])
                    if "error" in event:
                        errored, sent.error = True, line
                    if event.get("usage"):  # what the client was told, even if cut later
                        sent.prompt = event["usage"]["prompt_tokens"]
                        sent.completion = event["usage"]["completion_tokens"]
            sent.state = "unended" if not ended else "failed" if errored else "ok"

    async def client_loop(self) -> None:
        while self.waiting:
            await self.open.wait()
            if not self.waiting:
                return
            sent = self.waiting.pop()
            await self.one(sent)
            self.done += 1
            for count, event in self.reached.items():
                if self.done >= count:
                    event.set()

    async def kills(self) -> None:
        await self.when_done(KILL_WORKER_AT)
        pid = await self._worker_pid("fake-chat")
        held = [asyncio.create_task(self.one(sent)) for sent in self.held]
        await self._held_arrived(held)
        os.kill(pid, signal.SIGKILL)
        await asyncio.gather(*held)
        await self.when_done(KILL_COORDINATOR_AT)
        self.open.clear()  # no request starts until it is back
        self.in_flight_at_kill = sorted(self.in_flight)
        self.coordinator_killed_at = time.monotonic()
        # on the loop, which it blocks for the few ms SIGKILL takes: nothing moves meanwhile
        self.server.stop(signal.SIGKILL)
        if self.in_flight:
            await asyncio.wait_for(self.drained.wait(), 30)
        await self.client.aclose()
        await asyncio.to_thread(self.server.start, 60)
        self.client = self._client()
        self.open.set()

    async def _worker_pid(self, model: str) -> int:
        status = (await self.client.get("/api/v1/status", headers=ADMIN)).json()
        return next(s["pid"] for s in status["slots"] if s["model"] == model)

    async def _held_arrived(self, held: list[asyncio.Task[None]]) -> None:
        """Until the worker's log says it holds every held request."""
        for _ in range(12000):  # 120 s
            if self.held_log.is_file() and len(self.held_log.read_text().split()) >= HELD:
                return
            if all(task.done() for task in held):
                break  # answered without being held: the assertion says how
            await asyncio.sleep(0.01)
        status = (await self.client.get("/api/v1/status", headers=ADMIN)).json()
        slot = next(s for s in status["slots"] if s["model"] == "fake-chat")
        raise AssertionError(f"the chat worker never got the held requests: {self.held}; "
                             f"its slot: {slot['state']}, {slot['active_requests']} active, "
                             f"{slot['waiters']} waiting; the queue: {status['queue']}")

    async def run(self) -> None:
        await asyncio.gather(self.kills(), *(self.client_loop() for _ in range(CONCURRENCY)))
        await self.client.aclose()


def test_nothing_lost_across_a_worker_and_a_coordinator_sigkill(tmp_path_factory):
    began = time.monotonic()
    workdir = tmp_path_factory.mktemp("ledger-kills")
    held_log = workdir / "held.log"
    server = ServerProcess(
        workdir, {"admin_api_key": ADMIN_KEY, **GPU},
        # at most 4 requests in the chat worker: 5 failures in a row would cool the model
        # down for 30 s; the held ones stay there until it is killed
        [fake_worker("fake-chat", "llm", "--chunks", "4", "--chunk-delay-ms", "3",
                     "--answer-delay-ms", "5", "--hold-marker", HOLD, "--hold-ms", "30000",
                     "--held-log", str(held_log), parallel=4),
         fake_worker("fake-embed", "embedding")], headers=ADMIN)
    server.start(timeout=60)
    try:
        url = server.url
        # each key's limits are checked on every request (and never reached)
        secrets = {"north": make_key(url, "north", models=["fake-*"],
                                     requests_per_minute=100_000, tokens_per_day=10**9),
                   "south": make_key(url, "south", tokens_per_minute=10**9,
                                     gpu_seconds_per_day=10**6),
                   "west": make_key(url, "west", endpoints=["chat", "embeddings"],
                                    tokens_per_month=10**10)}
        run = Run(server, secrets, plan(list(secrets)), held_log)
        asyncio.run(run.run())
        loaded = time.monotonic()
        listed = usage_rows(url, "end_user,key,model,outcome")
        totals = usage_rows(url, "key,model")
    finally:
        server.stop()

    sent_all = [*run.planned, *run.held]
    states = Counter(s.state for s in sent_all)
    assert states["ok"] + states["failed"] + states["cut"] == len(sent_all), (
        states, [s for s in sent_all if s.state not in ("ok", "failed", "cut")][:5])
    rows = {r["end_user"]: r for r in listed}
    assert len(rows) == len(listed) and all(r["requests"] == 1 for r in listed)  # one a label
    assert not set(rows) - {s.label for s in sent_all}
    # the requests the worker's death cut, the held ones among them: each a row, "failed"
    cut_by_worker = [s for s in sent_all if s.state == "failed"]
    assert all(s.state == "failed" for s in run.held), run.held
    assert len(cut_by_worker) <= 4, cut_by_worker  # the worker's parallel
    for sent in cut_by_worker:
        assert "worker" in sent.error, sent  # worker_failed: no other error than the kill's
        assert sent.label in rows, sent
        assert rows[sent.label]["outcome"] == "failed", rows[sent.label]
    # every answer a client received is a row with its figures, but for those that ended
    # just before the coordinator died, which it had not written yet
    unwritten = [s for s in sent_all if s.state != "cut" and s.label not in rows]
    for sent in sent_all:
        row = rows.get(sent.label)
        if row is None:
            continue
        assert (row["key"], row["model"]) == (sent.key, sent.model), (sent, row)
        if sent.state != "cut":
            assert (row["prompt_tokens"], row["completion_tokens"]) == (
                sent.prompt, sent.completion), (sent, row)
            assert row["outcome"] == ("ok" if sent.state == "ok" else "failed"), (sent, row)
    for sent in unwritten:
        assert (sent.state == "ok" and sent.label in run.in_flight_at_kill) \
            or sent.finished >= run.coordinator_killed_at - UNWRITTEN_WINDOW_S, sent
    cut = [s for s in sent_all if s.state == "cut"]
    assert {s.label for s in cut} <= set(run.in_flight_at_kill)
    # served, but the client never got the answer: in the ledger, not in what was told
    cut_with_rows = [s for s in cut if s.label in rows]

    def tokens(figures: list[tuple[int, int]]) -> tuple[int, int]:
        return sum(p for p, _ in figures), sum(c for _, c in figures)

    received = tokens([(s.prompt, s.completion) for s in sent_all if s.state != "cut"])
    missing = tokens([(s.prompt, s.completion) for s in unwritten])
    extra = tokens([(rows[s.label]["prompt_tokens"], rows[s.label]["completion_tokens"])
                    for s in cut_with_rows])
    ledger = tokens([(r["prompt_tokens"], r["completion_tokens"]) for r in totals])
    print(f"\n{len(sent_all)} requests in {loaded - began:.1f}s: {states['ok']} answered, "
          f"{len(cut_by_worker)} cut by the worker's SIGKILL ({HELD} held there), rows "
          f"'failed'; {len(run.in_flight_at_kill)} in flight at the coordinator's SIGKILL, "
          f"{len(cut)} of them cut ({len(cut_with_rows)} in the ledger all the same); "
          f"{len(unwritten)} answered before it and not yet written, {missing} tokens; "
          f"prompt and completion tokens: ledger {ledger}, received {received}")
    assert ledger == (received[0] - missing[0] + extra[0], received[1] - missing[1] + extra[1])
    assert sum(r["requests"] for r in totals) == len(rows)
