"""A folder of GGUF files and no YAML, changed while the coordinator runs: files appear and go,
a manifest overlays a file, a broken manifest changes nothing, a removal mid-stream lets the
stream finish, SIGHUP reloads. Real SmolLM2 workers; the demo file linked under several names."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, wait_for
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow


def link(models: Path, name: str, target: Path) -> Path:
    path = models / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory, demo_gguf):
    workdir = tmp_path_factory.mktemp("live")
    models = workdir / "models"
    link(models, "Alpha.gguf", demo_gguf)
    link(models, "team/Beta-00001-of-00001.gguf", demo_gguf)
    server = ServerProcess(workdir, {"discover": True, "models_dir": str(models),
                                     "watch_debounce_ms": 100}, [])
    server.start()
    yield server, models
    server.stop()


def ids(server: ServerProcess) -> dict[str, str]:
    data = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    return {m["id"]: m["source"] for m in data}


def events(server: ServerProcess, kind: str) -> list[dict]:
    data = httpx.get(server.url + "/api/v1/events?stream=false", timeout=10).json()["events"]
    return [e for e in data if e["type"] == kind]


def test_every_file_is_served_by_its_name_with_no_yaml(folder, demo_gguf):
    server, _ = folder
    assert ids(server) == {"alpha": "discovered", "beta": "discovered"}
    tags = httpx.get(server.url + "/api/tags", timeout=10).json()["models"]
    assert {(t["name"], t["source"]) for t in tags} == {("alpha", "discovered"),
                                                        ("beta", "discovered")}
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="beta", max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    slot = httpx.get(server.url + "/api/v1/models/beta/status", timeout=10).json()
    assert slot["state"] == "ready"
    described = {m["id"]: m for m in httpx.get(server.url + "/api/v1/models",
                                               timeout=10).json()["models"]}
    assert described["beta"]["path"].endswith("team/Beta-00001-of-00001.gguf")


def test_a_new_file_appears_without_a_restart(folder, demo_gguf):
    server, models = folder
    link(models, "gamma.gguf", demo_gguf)
    wait_for(lambda: "gamma" in ids(server), timeout=15, what=lambda: ids(server))
    reloads = events(server, "catalog_reloaded")
    assert reloads and reloads[-1]["added"] == ["gamma"], reloads


def test_a_broken_manifest_changes_nothing_and_says_where(folder):
    server, _ = folder
    manifests = server.workdir / "manifests"
    before = ids(server)
    (manifests / "bad.yaml").write_text("id: broken\nctx_size: lots\n")
    answer = httpx.post(server.url + "/api/v1/reload", timeout=30).json()
    assert answer["added"] == answer["changed"] == answer["removed"] == []
    assert len(answer["errors"]) == 1 and "bad.yaml: ctx_size:" in answer["errors"][0], answer
    assert ids(server) == before
    assert server.status()["catalog"]["errors"] == answer["errors"]
    (manifests / "bad.yaml").unlink()
    wait_for(lambda: not server.status()["catalog"]["errors"], timeout=15,
             what=lambda: server.status()["catalog"])
    assert ids(server) == before


def test_a_manifest_overlays_a_file_and_a_change_reloads_its_worker(folder):
    server, _ = folder
    manifests = server.workdir / "manifests"
    (manifests / "alpha.yaml").write_text(
        "id: alpha\npath: Alpha.gguf\nthreads: 1\nctx_size: 1024\npriority: 7\n")
    # the watcher takes it (this test's POSTs may come before or after it: the same reload)
    httpx.post(server.url + "/api/v1/reload", timeout=30)
    wait_for(lambda: ids(server)["alpha"] == "manifest", timeout=15, what=lambda: ids(server))
    assert any(e["changed"] == ["alpha"] for e in events(server, "catalog_reloaded"))
    body = {"model": "alpha", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).is_success
    first_pid = httpx.get(server.url + "/api/v1/models/alpha/status", timeout=10).json()["pid"]
    # a flag the worker runs with changes: drained, stopped, and loaded anew when next asked
    (manifests / "alpha.yaml").write_text(
        "id: alpha\npath: Alpha.gguf\nthreads: 1\nctx_size: 512\npriority: 7\n")
    httpx.post(server.url + "/api/v1/reload", timeout=30)
    wait_for(lambda: httpx.get(server.url + "/api/v1/models/alpha/status",
                               timeout=10).json()["state"] == "idle", timeout=30)
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).is_success
    slot = httpx.get(server.url + "/api/v1/models/alpha/status", timeout=10).json()
    assert slot["pid"] != first_pid
    props = httpx.get(server.url + "/props", params={"model": "alpha"}, timeout=10).json()
    assert props["default_generation_settings"]["n_ctx"] == 512


def test_a_file_removed_mid_stream_lets_the_stream_finish_then_is_gone(folder, demo_gguf):
    server, models = folder
    doomed = link(models, "doomed.gguf", demo_gguf)
    wait_for(lambda: "doomed" in ids(server), timeout=15, what=lambda: ids(server))
    body = {"model": "doomed", "max_tokens": 48, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a story."}]}
    pieces: list[str] = []
    finished: list[str] = []
    first = threading.Event()

    def read() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=120) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
                first.set()
                if choice.get("finish_reason"):
                    finished.append(choice["finish_reason"])

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(60), server.log()
    doomed.unlink()
    reader.join(120)
    assert finished == ["length"], (finished, pieces)
    wait_for(lambda: "doomed" not in ids(server), timeout=15, what=lambda: ids(server))
    missing = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                         json={**body, "stream": False})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    wait_for(lambda: all(s["model"] != "doomed" for s in server.status()["slots"]),
             timeout=30, what=lambda: server.status()["slots"])
    assert events(server, "model_removed")[-1]["model"] == "doomed"


def test_sighup_reloads_when_nothing_is_watched(make_server, demo_gguf, tmp_path):
    models = tmp_path / "models"
    link(models, "one.gguf", demo_gguf)
    server = make_server({"discover": True, "models_dir": str(models), "watch": False})
    assert set(ids(server)) == {"one"}
    assert server.status()["catalog"]["watching"] is False
    link(models, "two.gguf", demo_gguf)
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: set(ids(server)) == {"one", "two"}, timeout=15, what=lambda: ids(server))
    assert server.proc.poll() is None
    # nothing watched: the API's reload is the one that sees a change, and answers it
    (models / "one.gguf").unlink()
    link(models, "three.gguf", demo_gguf)
    answer = httpx.post(server.url + "/api/v1/reload", timeout=30).json()
    assert answer == {"added": ["three"], "changed": [], "removed": ["one"], "errors": []}
