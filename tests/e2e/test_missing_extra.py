"""A model whose extra is not installed, as a new user meets it: with the
llama extra alone and a diffusers pipeline (and an embedder) in the models folder, the models
are listed unavailable naming the extra and its install command, and a request is refused at
once in each API's envelope, no worker started; a worker that fails anyway fails its load at
its first health answer, in its own words and with the extra to install.

Nothing is uninstalled: a ``sitecustomize`` on ``PYTHONPATH`` puts a finder first on
``sys.meta_path`` that answers the extras' modules as an install without them does (an import
raises ``ModuleNotFoundError: No module named 'torch'``, ``find_spec`` finds nothing)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.transformers_fixtures import build_embedder, shared

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                                 reason="the 'transformers' extra")]

# what the llama extra alone lacks: the diffusion and transformers extras, llama-cpp-python
NOT_INSTALLED = ("torch", "diffusers", "transformers", "sentence_transformers", "av",
                 "llama_cpp")
GPUS = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]}


def without(folder, modules) -> str:
    """A folder for PYTHONPATH whose sitecustomize makes ``modules`` missing."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(NOT_FOUND.format(names=tuple(modules)))
    return str(folder)


NOT_FOUND = """import sys


class NotInstalled:
    names = frozenset({names!r})

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in cls.names:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled)
"""


@pytest.fixture(scope="module")
def llama_alone(tmp_path_factory, tiny_sd, demo_gguf):
    models = tmp_path_factory.mktemp("models")
    (models / "tiny-sd").symlink_to(tiny_sd)
    (models / "minilm-embedder").symlink_to(shared(tmp_path_factory, "embedder",
                                                   build_embedder))
    (models / "smol.gguf").symlink_to(demo_gguf)
    shim = without(tmp_path_factory.mktemp("shim") / "site", NOT_INSTALLED)
    srv = ServerProcess(tmp_path_factory.mktemp("llama-alone"),
                        {**GPUS, "models_dir": str(models), "discover": True},
                        [llama_manifest("cpp-chat", demo_gguf, worker="llama-cpp-python")],
                        env={"PYTHONPATH": shim})
    srv.start()
    yield srv
    srv.stop()


def refused(response: httpx.Response, started: float) -> float:
    """The seconds a refusal took; it is a 503 answered in under 2 s."""
    seconds = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert seconds < 2, f"refused after {seconds:.2f}s"
    return seconds


def test_models_whose_extra_is_missing_are_listed_unavailable_naming_it(llama_alone):
    cards = {m["id"]: m for m in httpx.get(llama_alone.url + "/v1/models").json()["data"]}
    assert cards["smol"]["available"] is True  # the llama extra is there
    expected = {"tiny-sd": ("'diffusion' extra", "`bash scripts/setup.sh llama,diffusion`"),
                "minilm-embedder": ("'transformers' extra",
                                    "`bash scripts/setup.sh llama,transformers`"),
                "cpp-chat": ("'llama-cpp-python' extra", "llama,llama-cpp-python`")}
    for model, words in expected.items():
        assert cards[model]["available"] is False
        assert all(w in cards[model]["unavailable_reason"] for w in words), cards[model]
    assert "no module named 'torch', 'diffusers', 'transformers'" in \
        cards["tiny-sd"]["unavailable_reason"]
    # ps and the dashboard read the status document's models
    status = {m["id"]: m for m in llama_alone.status()["models"]}
    assert "'diffusion' extra" in status["tiny-sd"]["unavailable_reason"]
    ps = subprocess.run([sys.executable, "-m", "model_boss", "--url", llama_alone.url, "ps"],
                        capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0, ps.stderr
    assert "tiny-sd: this install lacks the 'diffusion' extra" in ps.stdout


def test_a_request_is_refused_at_once_in_openais_envelope(llama_alone):
    started = time.monotonic()
    response = httpx.post(llama_alone.url + "/v1/images/generations", timeout=30,
                          json={"model": "tiny-sd", "prompt": "a red square", "size": "64x64"})
    seconds = refused(response, started)
    error = response.json()["error"]
    assert error["code"] == "model_unavailable" and error["param"] == "model"
    assert error["type"] == "server_error"
    assert "'diffusion' extra" in error["message"]
    assert "bash scripts/setup.sh llama,diffusion" in error["message"]
    print(f"images refused in {seconds * 1000:.0f} ms")
    started = time.monotonic()
    embedded = httpx.post(llama_alone.url + "/v1/embeddings", timeout=30,
                          json={"model": "minilm-embedder", "input": "a cat"})
    refused(embedded, started)
    assert "'transformers' extra" in embedded.json()["error"]["message"]
    assert not llama_alone.status()["slots"]  # no load was tried
    assert not llama_alone.worker_pids()


def test_ollamas_routes_refuse_in_ollamas_envelope(llama_alone):
    for path, body, extra in (
            ("/api/embed", {"model": "minilm-embedder", "input": "a cat"}, "'transformers'"),
            ("/api/chat", {"model": "cpp-chat", "stream": False,
                           "messages": [{"role": "user", "content": "hi"}]},
             "'llama-cpp-python'")):
        started = time.monotonic()
        response = httpx.post(llama_alone.url + path, json=body, timeout=30)
        refused(response, started)
        error = response.json()["error"]
        assert isinstance(error, str) and f"{extra} extra" in error, response.text


def test_anthropics_route_refuses_in_anthropics_envelope(llama_alone):
    started = time.monotonic()
    response = httpx.post(llama_alone.url + "/v1/messages", timeout=30,
                          headers={"anthropic-version": "2023-06-01"},
                          json={"model": "cpp-chat", "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hi"}]})
    refused(response, started)
    body = response.json()
    assert body["type"] == "error", body
    assert "'llama-cpp-python' extra" in body["error"]["message"]
    assert "bash scripts/setup.sh llama,llama-cpp-python" in body["error"]["message"]


def test_a_worker_that_cannot_import_its_extra_fails_its_load_at_once(tmp_path_factory,
                                                                      tiny_sd):
    """The catalog's check passes (the coordinator has torch), the worker's own environment
    (its manifest's ``env``) has none: the load fails at the worker's first health answer
    that says so, not at the health time-out, naming the module and the extra."""
    shim = without(tmp_path_factory.mktemp("worker-shim") / "site", ("torch",))
    srv = ServerProcess(tmp_path_factory.mktemp("worker-without-torch"),
                        {**GPUS, "health_timeout_s": 120},
                        [{"id": "tiny-sd", "category": "diffusion", "backend": "diffusers",
                          "path": str(tiny_sd), "vram_mb": 3000,
                          "env": {"PYTHONPATH": shim}}])
    srv.start()
    try:
        started = time.monotonic()
        response = httpx.post(srv.url + "/v1/images/generations", timeout=150, json={
            "model": "tiny-sd", "prompt": "a red square", "size": "64x64"})
        seconds = time.monotonic() - started
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "model_load_failed"
        assert "ModuleNotFoundError: No module named 'torch'" in error["message"], error
        assert "bash scripts/setup.sh llama,diffusion" in error["message"], error
        assert seconds < 30, f"the load failed after {seconds:.1f}s"  # health_timeout_s: 120
        print(f"load failed in {seconds:.2f} s: {error['message']}")
    finally:
        srv.stop()
