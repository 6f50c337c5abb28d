"""Pulls through the real ``huggingface_hub`` client against a local stand-in for the hub's
file API (no hub is reachable here): by quantization, Ollama's /api/pull with the ``ollama``
client, an interrupted download resumed by the next pull, a corrupt file refused, removal, a
transformers model's folder and a diffusers pipeline's."""

from __future__ import annotations

import base64
import json
import os

import httpx
import pytest

from model_boss.cli import main as cli_main
from tests.conftest import ServerProcess, wait_for
from tests.hub_standin import HubStandin
from tests.lazy_modules import lazy

ollama = lazy("ollama")

pytestmark = pytest.mark.slow

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ADMIN = {"authorization": "Bearer admin-key"}


@pytest.fixture(scope="module")
def hub(demo_gguf):
    with HubStandin() as standin:
        standin.add_file(REPO, FILE, demo_gguf)
        standin.add_file(REPO, "SmolLM2-135M-Instruct.Q8_0.gguf", b"GGUF" + b"\0" * 4096)
        standin.add_file(REPO, "README.md", b"# SmolLM2\n")
        standin.add_file("other/tiny", "tiny-Q4_K_M.gguf", demo_gguf)
        yield standin


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub):
    workdir = tmp_path_factory.mktemp("pull")
    srv = ServerProcess(workdir, {"discover": True, "models_dir": str(workdir / "models"),
                                  "admin_api_key": "admin-key", "watch_debounce_ms": 100},
                        [{"id": "declared", "backend": "command", "command": ["true"]}],
                        env=hub.hf_env(workdir / "hf"), headers=ADMIN)
    srv.start()
    yield srv
    srv.stop()


def pull(server: ServerProcess, source: str) -> list[dict]:
    with httpx.stream("POST", server.url + "/api/v1/models/pull", headers=ADMIN, timeout=120,
                      json={"source": source}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def models(server: ServerProcess) -> dict[str, str]:
    data = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    return {m["id"]: m["source"] for m in data}


def test_a_pull_by_quantization_is_served_and_says_pulled(server, hub):
    lines = pull(server, f"hf://{REPO}:Q4_1")
    assert lines[0]["status"] in ("queued", "resolving")
    downloading = [line for line in lines if line["status"] == "downloading"]
    assert downloading and downloading[-1]["completed"] == downloading[-1]["total"] > 90e6
    assert lines[-1] == {"status": "success", "model": "smollm2-135m-instruct.q4_1",
                         "path": f"{REPO}/{FILE}"}
    assert models(server)["smollm2-135m-instruct.q4_1"] == "pulled"
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "smollm2-135m-instruct.q4_1", "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text
    record = json.loads((server.workdir / "models" / ".model-boss-pulls.json").read_text())
    assert record[f"{REPO}/{FILE}"]["source"] == f"hf://{REPO}:Q4_1"


def test_bad_and_unknown_sources_are_4xx(server):
    bad = httpx.post(server.url + "/api/v1/models/pull", headers=ADMIN, timeout=30,
                     json={"source": "ftp://nowhere"})
    assert bad.status_code == 400 and "hf://ORG/REPO" in bad.json()["error"]["message"]
    unknown = httpx.post(server.url + "/api/v1/models/pull", headers=ADMIN, timeout=30,
                         json={"source": "hf://nobody/nothing:Q4_0", "stream": False})
    assert unknown.status_code == 404, unknown.text
    no_quant = httpx.post(server.url + "/api/v1/models/pull", headers=ADMIN, timeout=30,
                          json={"source": f"hf://{REPO}:IQ2_XXS", "stream": False})
    assert no_quant.status_code == 404
    assert "Q8_0" in no_quant.json()["error"]["message"]  # it lists what there is
    denied = httpx.post(server.url + "/api/v1/models/pull", timeout=30,
                        json={"source": f"hf://{REPO}:Q4_1"})
    assert denied.status_code == 401


def test_an_interrupted_pull_serves_nothing_and_the_next_one_resumes(server, hub):
    source = "hf://other/tiny/tiny-Q4_K_M.gguf"
    partial = server.workdir / "models" / "other/tiny/tiny-Q4_K_M.gguf.partial"
    # a cut at 30 MB, then the hub drops every try at once: more tries than a pull makes
    hub.cut_after("tiny-Q4_K_M.gguf", 30_000_000)
    hub.cut_after("tiny-Q4_K_M.gguf", 0, times=10)
    lines = pull(server, source)
    assert lines[-1]["status"] == "failed", lines[-1]
    assert "pull again to resume" in lines[-1]["error"]["message"]
    assert "tiny-q4_k_m" not in models(server)
    kept = partial.stat().st_size
    assert kept == 30_000_000  # every byte received is kept for the next pull
    hub.clear_faults()
    hub.requests.clear()
    lines = pull(server, source)
    assert lines[-1]["status"] == "success", lines[-1]
    ranges = [r.range for r in hub.requests if r.method == "GET" and r.path.endswith(".gguf")]
    assert ranges == [f"bytes={kept}-"], ranges  # one GET, from where the last pull stopped
    assert not partial.exists()
    assert models(server)["tiny-q4_k_m"] == "pulled"


def test_a_file_failing_its_checksum_is_deleted_and_not_served(server, hub):
    hub.add_file("bad/repo", "bad-Q4_0.gguf", b"GGUF" + os.urandom(100_000))
    hub.corrupt("bad-Q4_0.gguf")
    lines = pull(server, "hf://bad/repo:Q4_0")
    assert lines[-1]["status"] == "failed" and "checksum" in lines[-1]["error"]["message"]
    assert "bad-q4_0" not in models(server)
    assert not list((server.workdir / "models" / "bad").rglob("*.gguf*"))


def test_ollamas_client_pulls_with_progress(server, hub):
    hub.add_file("olla/ma", "ma-Q4_K_M.gguf", b"GGUF" + b"\1" * 200_000)
    client = ollama.Client(host=server.url, headers=ADMIN)
    progress = list(client.pull("hf.co/olla/ma:Q4_K_M", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    assert any(p.total and p.completed == p.total for p in progress)
    assert "ma-q4_k_m" in {m.model for m in client.list().models}
    # a model already served: success at once, as Ollama answers
    assert client.pull("declared").status == "success"
    with pytest.raises(ollama.ResponseError) as missing:
        client.pull("llama3")
    assert missing.value.status_code == 404


def test_rm_deletes_a_pulled_model_and_refuses_a_manifests(server, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_BOSS_ADMIN_API_KEY", "admin-key")
    wait_for(lambda: "ma-q4_k_m" in models(server), timeout=10)
    assert cli_main(["--url", server.url, "rm", "ma-q4_k_m"]) == 0
    assert "ma-q4_k_m" not in models(server)
    assert not (server.workdir / "models" / "olla/ma/ma-Q4_K_M.gguf").exists()
    assert cli_main(["--url", server.url, "rm", "declared"]) == 1
    assert "is defined by" in capsys.readouterr().err  # the refusal, in one line
    refused = httpx.request("DELETE", server.url + "/api/delete", headers=ADMIN, timeout=30,
                            json={"model": "declared"})
    assert refused.status_code == 400 and "manifest" in refused.json()["error"]


def test_the_cli_pull_draws_progress_and_names_the_model(server, hub, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_BOSS_ADMIN_API_KEY", "admin-key")
    hub.add_file("cli/pull", "c-Q8_0.gguf", b"GGUF" + b"\2" * 300_000)
    assert cli_main(["--url", server.url, "pull", "hf://cli/pull"]) == 0
    out = capsys.readouterr()
    assert "serving it as 'c-q8_0'" in out.out
    assert "c-Q8_0.gguf" in out.err  # the bar
    assert cli_main(["--url", server.url, "pull", "hf://cli/none:Q4_0"]) == 1
    assert "not found on the hub" in capsys.readouterr().err


def test_a_transformers_repository_is_pulled_whole_listed_and_removed(server, hub,
                                                                     monkeypatch):
    """``hf://ORG/REPO`` with no GGUF and a ``config.json``: the folder, fetched beside the
    models and named once whole, is served as its kind; ``rm`` deletes the folder."""
    monkeypatch.setenv("MODEL_BOSS_ADMIN_API_KEY", "admin-key")
    for name, data in {"config.json": b'{"architectures": ["XLMRobertaForSequenceClassification"]'
                                      b', "id2label": {"0": "LABEL_0"}}',
                       "tokenizer.json": b"{}", "model.safetensors": b"\0" * 500_000,
                       "onnx/model.onnx": b"\1" * 1000}.items():
        hub.add_file("BAAI/tiny-reranker", name, data)
    lines = pull(server, "hf://BAAI/tiny-reranker")
    assert lines[-1] == {"status": "success", "model": "tiny-reranker",
                         "path": "BAAI/tiny-reranker"}
    listed = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    entry = next(m for m in listed if m["id"] == "tiny-reranker")
    assert (entry["category"], entry["source"]) == ("rerank", "pulled")
    folder = server.workdir / "models" / "BAAI" / "tiny-reranker"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors",
                                                        "tokenizer.json"]
    assert cli_main(["--url", server.url, "rm", "tiny-reranker"]) == 0
    assert not folder.exists() and "tiny-reranker" not in models(server)
    record = json.loads((server.workdir / "models" / ".model-boss-pulls.json").read_text())
    assert "BAAI/tiny-reranker" not in record


def test_a_diffusers_pipeline_is_pulled_as_its_folder_and_draws(server, hub, tiny_sd):
    """``hf://ORG/REPO`` with ``model_index.json`` at its top: the pipeline as
    ``save_pretrained`` wrote it, plus the fp16 copy a hub repository ships beside it (left
    there), is fetched as the folder the diffusers worker loads and answers an image
    request."""
    for path in sorted(p for p in tiny_sd.rglob("*") if p.is_file()):
        name = path.relative_to(tiny_sd).as_posix()
        hub.add_file("tiny/sd-pipe", name, path)
        if name.endswith("diffusion_pytorch_model.safetensors"):
            hub.add_file("tiny/sd-pipe", name.replace(".safetensors", ".fp16.safetensors"), path)
    hub.add_file("tiny/sd-pipe", "README.md", b"# tiny\n")
    lines = pull(server, "hf://tiny/sd-pipe")
    assert lines[-1] == {"status": "success", "model": "sd-pipe", "path": "tiny/sd-pipe"}
    folder = server.workdir / "models" / "tiny" / "sd-pipe"
    got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert got == sorted(p.relative_to(tiny_sd).as_posix() for p in tiny_sd.rglob("*")
                         if p.is_file())
    listed = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    entry = next(m for m in listed if m["id"] == "sd-pipe")
    assert (entry["category"], entry["source"]) == ("diffusion", "pulled")
    image = httpx.post(server.url + "/v1/images/generations", timeout=300, json={
        "model": "sd-pipe", "prompt": "a red square", "size": "64x64", "x_steps": 2})
    assert image.status_code == 200, image.text
    assert base64.b64decode(image.json()["data"][0]["b64_json"])[:8] == b"\x89PNG\r\n\x1a\n"
