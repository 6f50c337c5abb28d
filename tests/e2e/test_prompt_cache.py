"""Prompt caches across swaps, on real llama.cpp workers: two models on the demo GGUF share a
declared GPU that holds one. A long prefix to A, a request to B (A is evicted and its slot
saved), then A again with the same prefix: the slot is restored at A's load, the answer says
how many prompt tokens came from the cache, and it is the answer A gave without one (at
temperature 0). A's saves are never restored into B, the files are private, a cut-short save
is never restored, and an admin call clears a model's saves."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest

pytestmark = pytest.mark.slow

# about 480 tokens of the demo model's vocabulary: well past prompt_cache_min_tokens, and a
# prefill that on one CPU thread costs seconds, so a restore shows
PREFIX = "You answer questions about numbers. " + " ".join(
    f"Fact {i}: after {i} comes {i + 1}." for i in range(40))
LONG = 400  # prompt tokens the prefix is at least
QUESTION = [{"role": "system", "content": PREFIX},
            {"role": "user", "content": "What comes after 7?"}]


@pytest.fixture(scope="module")
def server(demo_gguf, tmp_path_factory):
    manifests = [llama_manifest(m, demo_gguf, ctx_size=2048, vram_mb=1000) for m in ("a", "b")]
    srv = ServerProcess(tmp_path_factory.mktemp("prompt-cache"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 1600}],
                         "vram_margin_mb": 100, "prompt_cache_min_tokens": 256}, manifests)
    srv.start()
    yield srv
    srv.stop()


def chat(server: ServerProcess, model: str, messages: list[dict]) -> dict:
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "max_tokens": 12, "temperature": 0,
        "seed": 1})
    assert answer.status_code == 200, answer.text
    return answer.json()


def cache_of(server: ServerProcess, model: str) -> dict:
    return httpx.get(f"{server.url}/api/v1/models/{model}/status", timeout=30).json()[
        "prompt_cache"]


def shelf_files(server: ServerProcess) -> list[Path]:
    return sorted((server.workdir / "state" / "prompt-cache").rglob("*.*"))


def test_a_swap_back_restores_the_prompt_and_answers_the_same(server):
    cold = chat(server, "a", QUESTION)
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert prompt_tokens > LONG

    chat(server, "b", [{"role": "user", "content": "Hi"}])  # evicts a: its slot is saved
    a = next(s for s in server.status()["slots"] if s["model"] == "a")
    assert a["state"] == "idle"  # a llama worker is stopped (disk), not parked
    saved = cache_of(server, "a")
    assert saved["saves"] == 1 and saved["files"] == 1 and saved["mb"] > 1

    again = chat(server, "a", QUESTION)  # evicts b (its prompt is short: not kept)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt_tokens - 1
    assert again["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    restored = cache_of(server, "a")
    assert restored["restores"] == 1 and restored["restored_tokens"] >= prompt_tokens
    b = cache_of(server, "b")
    assert b["restores"] == 0 and b["files"] == 0  # nothing of a's ever went into b

    # each API says so in its own words: Anthropic's cache_read_input_tokens ...
    message = httpx.post(server.url + "/v1/messages", timeout=300, json={
        "model": "a", "max_tokens": 4, "temperature": 0, "system": PREFIX,
        "messages": [{"role": "user", "content": "What comes after 7?"}]}).json()
    assert message["usage"]["cache_read_input_tokens"] > LONG, message["usage"]
    # ... and llama.cpp's timings.cache_n (the same conversation, rendered by its template)
    rendered = httpx.post(server.url + "/apply-template", timeout=60,
                          json={"model": "a", "messages": QUESTION}).json()["prompt"]
    native = httpx.post(server.url + "/completion", timeout=300, json={
        "model": "a", "prompt": rendered, "n_predict": 2, "temperature": 0}).json()
    assert native["timings"]["cache_n"] > LONG, native["timings"]

    # the files are the coordinator user's alone; nothing half-written is left
    files = shelf_files(server)
    assert files and all(f.suffix in (".bin", ".json") for f in files)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert all(stat.S_IMODE(f.parent.stat().st_mode) == 0o700 for f in files)


def test_a_cut_short_save_is_never_restored_and_is_removed(server):
    chat(server, "a", QUESTION)
    chat(server, "b", [{"role": "user", "content": "Hi"}])  # a saved again
    bins = [f for f in shelf_files(server) if f.suffix == ".bin"]
    assert len(bins) == 1
    shelf = bins[0].parent
    # what a kill mid-save leaves: a .partial, and a .bin whose description never came
    (shelf / "0-1.partial").write_bytes(b"half a cache")
    bins[0].with_suffix(".json").unlink()
    before = cache_of(server, "a")["restores"]
    again = chat(server, "a", QUESTION)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a full prefill
    assert cache_of(server, "a")["restores"] == before
    assert not list(shelf.glob("*.partial")) and not list(shelf.glob("*.bin"))


def test_an_admin_call_clears_a_models_saves(server):
    chat(server, "a", QUESTION)
    chat(server, "b", [{"role": "user", "content": "Hi"}])
    assert cache_of(server, "a")["files"] == 1
    cleared = httpx.delete(server.url + "/api/v1/models/a/cache", timeout=30)
    assert cleared.status_code == 200 and cleared.json()["removed_files"] == 1
    assert cache_of(server, "a")["files"] == 0 and not shelf_files(server)
    missing = httpx.delete(server.url + "/api/v1/models/nope/cache", timeout=30)
    assert missing.status_code == 404
