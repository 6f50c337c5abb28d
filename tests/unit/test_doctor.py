"""``model-boss doctor``: what this install runs, by kind of model, and what the daemon cannot
serve and why."""

from __future__ import annotations

import httpx
import pytest

from model_boss.catalog.extras import KINDS, readiness
from model_boss.cli import doctor
from model_boss.cli.client import DaemonClient
from model_boss.cli.dispatch import main


def only(*present: str):
    return lambda module: module in present


@pytest.mark.parametrize(("present", "ready"), [
    # the README's set-up: the llama extra alone
    (("xllamacpp",), {"GGUF models on llama.cpp's own server (built in)",
                      "cloud remotes, commands, an external llama-server"}),
    # torch and diffusers but no transformers: no diffusers pipeline runs either
    (("xllamacpp", "torch", "diffusers"), {"GGUF models on llama.cpp's own server (built in)",
                                           "cloud remotes, commands, an external llama-server"}),
    (("xllamacpp", "torch", "diffusers", "transformers"), {
        "GGUF models on llama.cpp's own server (built in)", "diffusers picture pipelines",
        "cloud remotes, commands, an external llama-server"}),
    (("torch", "diffusers", "transformers", "av", "sentence_transformers", "xllamacpp",
      "llama_cpp", "silero_vad"), {kind for kind, _ in KINDS}),
])
def test_which_kinds_an_install_runs(present, ready):
    kinds = readiness(only(*present))
    assert [k.kind for k in kinds] == [kind for kind, _ in KINDS]
    assert {k.kind for k in kinds if k.ready} == ready
    for kind in kinds:
        needed = kind.needed.modules if kind.needed else ()
        assert kind.missing == tuple(m for m in needed if m not in present)


def test_the_table_names_what_is_missing_and_the_command_that_adds_it():
    lines = doctor.format_readiness(readiness(only("xllamacpp"))).splitlines()
    assert lines[0].split() == ["KIND", "EXTRA", "THIS", "INSTALL"]
    picture = next(line for line in lines if line.startswith("diffusers picture pipelines"))
    assert picture.endswith("diffusion         missing torch, diffusers, transformers: "
                            "bash scripts/setup.sh llama,diffusion")
    assert next(line for line in lines if line.startswith("GGUF models on llama.cpp")).endswith(
        "llama             ready")
    assert len(lines) == 1 + len(KINDS)


def daemon(models: list[dict] | None = None, status: int = 200) -> DaemonClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(status, json={"object": "list", "data": models or []})
    return DaemonClient("http://mb", transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(("client", "said"), [
    (daemon([{"id": "smol", "available": True}, {
        "id": "tiny-sd", "available": False,
        "unavailable_reason": "this install lacks the 'diffusion' extra"}]),
     "the daemon at http://mb: 1 of its 2 models cannot be served now:\n"
     "  tiny-sd: this install lacks the 'diffusion' extra"),
    (daemon([{"id": "smol", "available": True}]),
     "the daemon at http://mb: all 1 of its models can be served"),
    (daemon(status=401), "the daemon: "),
])
def test_what_the_daemon_cannot_serve(client, said):
    assert doctor.daemon_lines(client).startswith(said)


def test_doctor_runs_without_a_daemon(capsys, unused_tcp_port):
    assert main(["--url", f"http://127.0.0.1:{unused_tcp_port}", "doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("KIND") and "GGUF models on llama.cpp's own server" in out
    assert f"the daemon: cannot reach http://127.0.0.1:{unused_tcp_port}: connection refused" \
        in out
