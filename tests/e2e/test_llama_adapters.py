"""LoRA adapters and a draft model on the native llama worker (``python -m workers.llama``), a
real process serving the demo model; every answer greedy (temperature 0, a fixed seed, 16
tokens), so one answer can be compared with another."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_for
from tests.lora_fixtures import shared_lora, write_broken_lora_gguf

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--ctx-size", "512", "--threads", "1", "--parallel", "1")
ASK = {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0, "seed": 42}
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16, "temperature": 0, "seed": 42}


def lora(*scales: float) -> list[dict]:
    """The request field: adapter ``id`` at its scale, every adapter named."""
    return [{"id": index, "scale": scale} for index, scale in enumerate(scales)]


class Worker:
    """``python -m workers.llama`` on the demo model with ``flags``, its stderr kept in a
    file; ``ready()`` waits for ``/health`` 200 (or the process's end)."""

    def __init__(self, model: Path, log_dir: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"worker-{self.port}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.llama", "--model", str(model),
                 "--port", str(self.port), "--parent-pid", str(os.getpid()), *SMALL, *flags],
                stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self, timeout: float = 60) -> Worker:
        def up() -> bool:
            assert self.proc.poll() is None, self.log
            try:
                return httpx.get(self.url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=timeout, interval=0.1)
        return self

    def complete(self, **extra) -> dict:
        answer = httpx.post(self.url + "/completion", json={**ASK, **extra}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def answer(self, **extra) -> str:
        return self.complete(**extra)["content"]

    def chat(self, **extra) -> str:
        answer = httpx.post(self.url + "/v1/chat/completions", json={**CHAT, **extra},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]["content"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llama-adapter-logs")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, demo_gguf) -> tuple[Path, Path]:
    """Two rank-4 adapters on every attn_q and attn_v, different seeds."""
    return (shared_lora(tmp_path_factory, "smol-a", seed=0, base_gguf=demo_gguf),
            shared_lora(tmp_path_factory, "smol-b", seed=1, base_gguf=demo_gguf))


@pytest.fixture
def start(demo_gguf, logs):
    started: list[Worker] = []

    def launch(*flags: str) -> Worker:
        started.append(Worker(demo_gguf, logs, *flags))
        return started[-1]

    yield launch
    for worker in started:
        worker.stop()


@pytest.fixture(scope="module")
def base(demo_gguf, logs) -> dict[str, str]:
    """The demo model's own answers, from a worker with no adapters."""
    worker = Worker(demo_gguf, logs).ready()
    try:
        return {"completion": worker.answer(), "chat": worker.chat()}
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def switching(demo_gguf, logs, adapters):
    """One worker with both adapters loaded at scale 0 (``--lora-init-without-apply``)."""
    worker = Worker(demo_gguf, logs, "--lora", str(adapters[0]), "--lora", str(adapters[1]),
                    "--lora-init-without-apply").ready()
    yield worker
    worker.stop()


def test_adapters_loaded_without_apply_leave_the_base_and_switch_request_by_request(
        start, adapters, base):
    """A plain request is the base model's; each adapter changes the answer, each its own
    way; one process switches between them and back to the base, request by request. (A
    request without ``"lora"`` after one with an adapter would reuse the slot's KV as it is:
    llama.cpp checks an adapter change only for a request that names its adapters.)"""
    switching = start("--lora", str(adapters[0]), "--lora", str(adapters[1]),
                      "--lora-init-without-apply").ready()
    pid = switching.proc.pid
    assert switching.answer() == base["completion"]  # a fresh slot: nothing applied
    first = switching.answer(lora=lora(1.0))
    second = switching.answer(lora=lora(0, 1.0))
    assert first != base["completion"] and second != base["completion"] and first != second
    # an adapter left out of a request is at scale 0 for it
    assert switching.answer(lora=[{"id": 1, "scale": 1.0}]) == second
    assert switching.answer(lora=lora(1.0, 0)) == first
    assert switching.answer(lora=lora(0, 0)) == base["completion"]  # the base, named
    assert switching.answer(lora=lora(0, 1.0)) == second
    assert switching.answer(lora=lora(1.0, 1.0)) not in (first, second, base["completion"])
    # the OpenAI route takes the same field
    assert switching.chat(lora=lora(1.0)) != base["chat"]
    assert switching.chat(lora=lora(0, 0)) == base["chat"]
    assert switching.proc.pid == pid and switching.proc.poll() is None


def test_lora_adapters_lists_them_with_their_ids_and_scales(switching, adapters):
    listed = httpx.get(switching.url + "/lora-adapters", timeout=10).json()
    assert [(a["id"], a["path"], a["scale"]) for a in listed] == [
        (0, str(adapters[0]), 0.0), (1, str(adapters[1]), 0.0)]
    switching.answer(lora=lora(1.0))  # a request's scales are its own, not the worker's
    assert [a["scale"] for a in httpx.get(switching.url + "/lora-adapters",
                                          timeout=10).json()] == [0.0, 0.0]


def test_a_per_request_adapter_answers_as_the_adapter_applied_at_start(switching, start,
                                                                         adapters):
    """llama.cpp's own answer with the adapter (``--lora FILE``, ``--lora-scaled
    FILE:SCALE``) is the answer a request gets by naming it."""
    applied = start("--lora", str(adapters[0]))
    scaled = start("--lora-scaled", f"{adapters[1]}:0.5")
    applied.ready()
    scaled.ready()
    assert applied.answer() == switching.answer(lora=lora(1.0))
    assert scaled.answer() == switching.answer(lora=lora(0, 0.5))
    assert scaled.answer() != switching.answer(lora=lora(0, 1.0))
    listed = httpx.get(applied.url + "/lora-adapters", timeout=10).json()
    assert [(a["path"], a["scale"]) for a in listed] == [(str(adapters[0]), 1.0)]


@pytest.mark.parametrize("flaw, said", [
    ("architecture", "model arch and LoRA arch mismatch"),
    ("shape", "has incorrect shape"),
])
def test_a_broken_adapter_fails_the_start_saying_why(start, demo_gguf, tmp_path, flaw, said):
    broken = write_broken_lora_gguf(tmp_path / f"{flaw}.gguf", demo_gguf, flaw)
    worker = start("--lora", str(broken), "--lora-init-without-apply")
    assert worker.proc.wait(60) == 1
    log = worker.log
    assert said in log and f"failed to load lora adapter '{broken}'" in log
    assert "llama.cpp server failed" in log


def test_a_missing_draft_model_fails_the_start_saying_why(start, tmp_path):
    worker = start("--model-draft", str(tmp_path / "no-such-draft.gguf"))
    assert worker.proc.wait(60) == 1
    assert "failed to load draft model" in worker.log


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_the_model_as_its_own_draft_answers_the_same_and_keeps_nearly_every_draft(
        start, demo_gguf, base):
    """Speculative decoding changes no greedy answer; a draft that is the model itself is
    right nearly every time. The counters are the server's own: the completion's
    ``timings.draft_n`` / ``draft_n_accepted``, and ``/metrics``'
    ``llamacpp:spec_decode_num_draft_tokens_total`` / ``..._accepted_tokens_total``."""
    worker = start("--model-draft", str(demo_gguf), "--draft-max", "8", "--metrics").ready()
    answer = worker.complete()
    assert answer["content"] == base["completion"]
    timings = answer["timings"]
    assert timings["draft_n"] >= 8  # at least one full draft of 8
    assert timings["draft_n_accepted"] / timings["draft_n"] >= 0.9
    metrics = httpx.get(worker.url + "/metrics", timeout=10).text
    drafted = metric(metrics, "llamacpp:spec_decode_num_draft_tokens_total")
    accepted = metric(metrics, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert (drafted, accepted) == (timings["draft_n"], timings["draft_n_accepted"])
    assert worker.chat() == base["chat"]
    slot = httpx.get(worker.url + "/slots", timeout=10).json()[0]
    assert slot["speculative"] and slot["params"]["speculative.types"] == "draft-simple"
    assert "loading draft model" in worker.log


def test_without_a_draft_the_server_drafts_nothing(switching):
    timings = switching.complete()["timings"]
    assert "draft_n" not in timings
    slot = httpx.get(switching.url + "/slots", timeout=10).json()[0]
    assert not slot["speculative"]

