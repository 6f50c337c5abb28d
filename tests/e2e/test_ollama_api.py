"""Ollama's API through model-boss with the official ``ollama`` Python client (sync, async,
streaming and not) against llama.cpp's native server on SmolLM2, one coordinator for the
module: names through manifests, aliases and tasks; options honoured; keep_alive; the
processor split ``/api/ps`` and ``model-boss ps`` report; errors in Ollama's envelope. Then
Ollama-speaking clients: langchain-ollama and llm-ollama (the ``clients`` extra), and the
official JavaScript client from npm where node and npm are there."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime

import pytest
import yaml

from model_boss.cli import main as cli_main
from tests.conftest import ROOT, ServerProcess, llama_manifest, wait_for
from tests.lazy_modules import lazy

ollama = lazy("ollama")

pytestmark = pytest.mark.slow

TASKS = "tasks:\n  chat:\n    candidates: [smollm2-135m]\n"
HI = [{"role": "user", "content": "Say hello."}]
SMALL = {"num_predict": 4}
TINY = {"num_predict": 1}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    workdir = tmp_path_factory.mktemp("ollama")
    (workdir / "tasks.yaml").write_text(TASKS)
    shipped = yaml.safe_load((ROOT / "manifests" / "smollm2.yaml").read_text())
    # one thread, as llama_manifest gives: with its default (every core) on this suite's two
    # processes on two cores, llama.cpp's threads wait on each other and a 6-token reply
    # took up to 14 s while the other process ran diffusers
    shipped["threads"] = 1
    manifests = [
        shipped,  # the demo manifest as shipped: its Ollama alias smollm2:135m
        llama_manifest("smol-embed", demo_gguf, embeddings=True, category="embedding",
                       pooling="mean"),
        # says it needs more than the declared GPU has: placed with some layers on the CPU
        llama_manifest("smol-partial", demo_gguf, vram_mb=100_000, allow_partial=True),
        llama_manifest("smol-spare", demo_gguf),  # the keep_alive test unloads this one
    ]
    srv = ServerProcess(workdir, {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}],
                                  "tasks_file": str(workdir / "tasks.yaml")}, manifests)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


@pytest.fixture
def aclient(server):
    return ollama.AsyncClient(host=server.url)


def loaded(client) -> dict:
    return {m.model: m for m in client.ps().models}


# --- chat and generate ---------------------------------------------------------------------

def test_chat_echoes_the_name_with_counts_and_durations(client):
    reply = client.chat(model="smollm2:135m", messages=HI, options=SMALL)
    assert reply.model == "smollm2:135m" and reply.done
    assert reply.done_reason in ("stop", "length")
    assert reply.message.role == "assistant" and reply.message.content.strip()
    assert 0 < reply.eval_count <= 4 and reply.prompt_eval_count > 5
    assert reply.eval_duration > 0 and reply.total_duration >= reply.eval_duration
    assert reply.load_duration is not None


def test_every_name_of_a_model_reaches_it(client, server):
    for name in ("smollm2-135m:latest", "smollm2", "demo", "task:chat", "task:chat:latest"):
        assert client.generate(model=name, prompt="Hi", options=TINY).model == name
    served = [s for s in server.status()["slots"] if s["model"] == "smollm2-135m"]
    assert served and served[0]["loads"] == 1  # one model behind every name


def test_chat_streams_ndjson_pieces_then_the_closing_line(client):
    chunks = list(client.chat(model="smollm2:135m", messages=HI, options=SMALL, stream=True))
    # pieces, then the closing line (the model may stop after one token)
    assert len(chunks) >= 2 and all(not c.done for c in chunks[:-1])
    last = chunks[-1]
    assert last.done and last.done_reason in ("stop", "length") and last.eval_count <= 4
    assert last.eval_duration > 0 and last.prompt_eval_count > 5
    assert "".join(c.message.content for c in chunks).strip()


def test_generate_whole_streamed_and_raw(client):
    whole = client.generate(model="smollm2:135m", prompt="Say hello.", options=SMALL)
    assert whole.response.strip() and whole.done and whole.eval_count <= 4
    pieces = list(client.generate(model="smollm2:135m", prompt="Say hello.", options=SMALL,
                                  stream=True, system="Answer in French."))
    assert pieces[-1].done and "".join(p.response for p in pieces[:-1]).strip()
    raw = client.generate(model="smollm2:135m", prompt="1, 2, 3, 4,", raw=True,
                          options={"num_predict": 4, "temperature": 0})
    assert raw.done and 0 < raw.eval_count <= 4 and raw.prompt_eval_count < 20  # no template


async def test_async_chat_generate_and_stream(aclient):
    reply = await aclient.chat(model="smollm2:135m", messages=HI, options=SMALL)
    assert reply.message.content.strip()
    pieces = [p async for p in await aclient.generate(model="smollm2:135m", prompt="Hi",
                                                        options=SMALL, stream=True)]
    assert pieces[-1].done and pieces[-1].eval_count <= 4
    chunks = [c async for c in await aclient.chat(model="smollm2:135m", messages=HI,
                                                  options=SMALL, stream=True)]
    assert chunks[-1].done and "".join(c.message.content for c in chunks).strip()


# --- options -------------------------------------------------------------------------------

@pytest.mark.parametrize("limit", [1, 3])
def test_num_predict_limits_the_tokens(client, limit):
    chunks = list(client.generate(model="smollm2:135m", prompt="Tell me a long story.",
                                  options={"num_predict": limit}, stream=True))
    assert chunks[-1].eval_count == limit and chunks[-1].done_reason == "length"
    assert len(chunks) - 1 <= limit


def test_seed_makes_sampling_reproducible(client):
    options = {"seed": 1234, "temperature": 1.5, "top_k": 200, "top_p": 1.0,
               "num_predict": 6}
    ask = [{"role": "user", "content": "Invent a name for a cat."}]
    first, second = (client.chat(model="smollm2:135m", messages=ask, options=options)
                     .message.content for _ in range(2))
    assert first == second


def test_stop_ends_the_answer_before_the_stop_string(client):
    options = {"temperature": 0, "num_predict": 10}
    full = client.generate(model="smollm2:135m", prompt="1, 2, 3, 4,", raw=True,
                           options=options).response
    assert "7" in full  # the count goes on: " 5, 6, 7, 8, 9,"
    cut = client.generate(model="smollm2:135m", prompt="1, 2, 3, 4,", raw=True,
                          options={**options, "stop": ["7"]})
    assert cut.done_reason == "stop" and cut.response == full[:full.index("7")]


def test_format_schema_and_json_parse(client):
    ask = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
    reply = client.chat(model="smollm2:135m", messages=ask, format=FLAG,
                        options={"temperature": 0, "num_predict": 24})
    assert set(json.loads(reply.message.content)) == {"ok"}
    chunks = list(client.generate(model="smollm2:135m", prompt="Is grass green? JSON.",
                                  format=FLAG, stream=True,
                                  options={"temperature": 0, "num_predict": 24}))
    assert set(json.loads("".join(c.response for c in chunks))) == {"ok"}
    anything = client.generate(model="smollm2:135m", prompt="Give a JSON object.",
                               format="json", options={"temperature": 0, "num_predict": 3})
    assert anything.response.lstrip().startswith("{")  # a JSON object from the first token


# --- embeddings ----------------------------------------------------------------------------

def test_embed_and_embeddings(client):
    result = client.embed(model="smol-embed", input=["a cat", "a dog"])
    assert len(result.embeddings) == 2 and len(result.embeddings[0]) > 100
    assert result.prompt_eval_count > 0
    for vector in result.embeddings:  # normalised, as Ollama's /api/embed answers
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0, abs=1e-3)
    short = client.embed(model="smol-embed", input="a bird", dimensions=32).embeddings[0]
    assert len(short) == 32 and math.sqrt(sum(x * x for x in short)) == pytest.approx(1.0)
    legacy = client.embeddings(model="smol-embed", prompt="a cat").embedding
    assert len(legacy) == len(result.embeddings[0])


async def test_embed_async(aclient):
    assert (await aclient.embed(model="smol-embed", input="a fish")).embeddings[0]


# --- tags, show, ps, keep_alive ------------------------------------------------------------

def test_tags_and_show(client):
    models = {m.model: m for m in client.list().models}
    assert {"smollm2-135m", "smol-embed", "smol-partial"} <= set(models)
    demo = models["smollm2-135m"]
    assert demo.details.format == "gguf" and demo.details.family == "llama"
    assert demo.details.quantization_level == "Q4_1" and demo.size > 90_000_000
    shown = client.show("smollm2:135m")
    assert shown.details.parameter_size == "135M" and "completion" in shown.capabilities
    assert shown.modelinfo["llama.block_count"] == 30
    assert "embedding" in client.show("smol-embed").capabilities


def _seconds_left(model) -> float:
    return (model.expires_at - datetime.now(UTC)).total_seconds()


def test_ps_reports_the_keep_alive_deadline_and_the_lease(client):
    client.chat(model="smollm2:135m", messages=HI, options=TINY, keep_alive="2m")
    demo = loaded(client)["smollm2-135m"]
    assert 100 < _seconds_left(demo) <= 120
    # the shipped manifest sets no ctx_size: the context SmolLM2 was trained with
    assert 0 < demo.size_vram <= demo.size and demo.context_length == 8192
    client.generate(model="smollm2:135m", prompt="Hi", options=TINY, keep_alive=-1)
    assert _seconds_left(loaded(client)["smollm2-135m"]) > 100 * 365 * 86400
    client.generate(model="smollm2:135m", prompt="Hi", options=TINY, keep_alive=300)
    assert 280 < _seconds_left(loaded(client)["smollm2-135m"]) <= 300


def test_keep_alive_0_unloads_after_the_request(client, server):
    # a few tokens: one alone may be half a character (an emoji), which a stream holds back
    reply = client.chat(model="smol-spare", messages=HI, options={"num_predict": 8},
                        keep_alive=0)
    assert reply.message.content
    wait_for(lambda: "smol-spare" not in loaded(client), timeout=30)
    client.generate(model="smol-spare")  # an empty prompt loads
    assert "smol-spare" in loaded(client)
    assert client.generate(model="smol-spare", keep_alive=0).done_reason == "unload"
    assert "smol-spare" not in loaded(client)


def test_a_partly_offloaded_model_shows_its_split(client, server, capsys):
    client.generate(model="smol-partial", prompt="Hi", options=TINY)
    partial = server.status()["slots"]
    slot = next(s for s in partial if s["model"] == "smol-partial")
    layers = slot["placement"]["gpu_layers"]
    assert slot["placement"]["kind"] == "partial" and 0 < layers < 30
    model = loaded(client)["smol-partial"]
    assert 0 < model.size_vram < model.size
    label = f"{100 - round(100 * layers / 30)}%/{round(100 * layers / 30)}% CPU/GPU (declared)"
    assert slot["processor"]["label"] == label
    assert cli_main(["--url", server.url, "ps"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert label in rows["smol-partial"] and "100% GPU (declared)" in rows["smollm2-135m"]
    assert "declared" in rows["0"] and "from now" in rows["smol-partial"]


# --- errors --------------------------------------------------------------------------------

def test_unknown_model_is_a_404(client):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3:8b", messages=HI)
    assert missing.value.status_code == 404 and "llama3:8b" in missing.value.error


@pytest.mark.parametrize("call", [lambda c: c.delete("smol-embed"),
                                  lambda c: c.copy("smol-embed", "other"),
                                  lambda c: c.push("smol-embed")])
def test_model_management_is_refused_saying_why(client, call):
    with pytest.raises(ollama.ResponseError) as refused:
        call(client)
    assert refused.value.status_code == 400 and "manifest" in refused.value.error
    assert "smol-embed" in {m.model for m in client.list().models}


def test_a_pull_of_a_name_not_on_the_hub_says_how_to_name_one(client):
    with pytest.raises(ollama.ResponseError) as missing:
        client.pull("llama3")
    assert missing.value.status_code == 404
    assert "hf.co/ORG/REPO:QUANT" in missing.value.error
    assert client.pull("smol-embed").status == "success"  # served already


@pytest.mark.parametrize("stream", [False, True])
def test_client_mistakes_are_400s_without_internals(client, stream):
    cases = [
        dict(options={"num_ctx": 100_000}, words="ctx_size"),
        dict(format={"type": "nonsense"}, words="nonsense"),
        dict(messages=[{"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}],
             words="images"),
    ]
    for case in cases:
        words = case.pop("words")
        case.setdefault("messages", HI)
        with pytest.raises(ollama.ResponseError) as refused:
            result = client.chat(model="smollm2:135m", stream=stream, **case)
            if stream:
                list(result)
        assert refused.value.status_code == 400 and words in refused.value.error
        assert "Traceback" not in refused.value.error and "/root" not in refused.value.error


def test_embeddings_of_a_chat_model_are_a_400(client):
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="smollm2:135m", input="a cat")
    assert refused.value.status_code == 400


# --- Ollama-speaking clients (the 'clients' extra) -----------------------------------------

def test_langchain_ollama_chat_stream_and_embeddings(server):
    langchain_ollama = pytest.importorskip(
        "langchain_ollama", reason="needs the 'clients' extra: pip install -e '.[clients]'")
    chat = langchain_ollama.ChatOllama(base_url=server.url, model="smollm2:135m",
                                       num_predict=4, temperature=0)
    assert chat.invoke("Say hello.").content.strip()
    assert "".join(chunk.content for chunk in chat.stream("Say hello.")).strip()
    vectors = langchain_ollama.OllamaEmbeddings(base_url=server.url, model="smol-embed")
    assert len(vectors.embed_query("a cat")) > 100


def test_llm_cli_with_the_llm_ollama_plugin(server, tmp_path):
    pytest.importorskip("llm_ollama", reason="needs the 'clients' extra")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OLLAMA_HOST": server.url}

    def llm(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "llm", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    listed = llm("ollama", "models")
    assert listed.returncode == 0 and "smollm2-135m" in listed.stdout, listed.stderr
    # llm-ollama names models by their Ollama name, or (newer releases) "ollama/<name>":
    # the installed release's way first, the other only if that one is unknown
    version = tuple(int(part) for part in importlib.metadata.version("llm-ollama").split(".")[:2])
    names = ["ollama/smollm2-135m", "smollm2-135m"]
    if version < (0, 17):
        names.reverse()
    done = llm("-m", names[0], "Say hello.", "-o", "num_predict", "4")
    chat_id = names[0]
    if "Unknown model" in done.stderr:
        chat_id = names[1]
        done = llm("-m", chat_id, "Say hello.", "-o", "num_predict", "4")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    embed_id = chat_id.replace("smollm2-135m", "smol-embed")
    embedded = llm("embed", "-m", embed_id, "-c", "a cat")
    assert embedded.returncode == 0, embedded.stderr
    assert len(json.loads(embedded.stdout)) > 100


def test_the_official_javascript_client(server, tmp_path):
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("needs node and npm for the 'ollama' JavaScript client")
    installed = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund",
                                "--prefix", str(tmp_path), "ollama@0.6"],
                               capture_output=True, text=True, timeout=180)
    if installed.returncode != 0:
        pytest.skip(f"npm could not install the 'ollama' client: {installed.stderr[-300:]}")
    probe = tmp_path / "probe.mjs"
    shutil.copy(ROOT / "tests" / "e2e" / "ollama_js_probe.mjs", probe)
    ran = subprocess.run(["node", str(probe)], env={**os.environ, "OLLAMA_HOST": server.url},
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["chat"]["done"] and 0 < seen["chat"]["eval_count"] <= 4
    assert seen["stream"]["done"] and seen["stream"]["text"].strip()
    assert 0 < seen["stream"]["eval_count"] <= 4
    assert seen["stream"]["done_reason"] in ("stop", "length")
    assert seen["embed"] > 100 and "smollm2-135m" in seen["tags"]
    assert any(name == "smollm2-135m" and in_vram for name, in_vram, _ in seen["ps"])
    assert seen["missing"][0] == 404 and seen["pull"][0] == 404
