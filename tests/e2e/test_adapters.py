"""LoRA adapters and a draft model through a real coordinator: the demo model as a base with
two adapters (random LoRA GGUFs the tests write), each served under its own id on the base's
one worker; a broken adapter listed unavailable without touching its base; the demo model as
its own draft, its acceptance read from the worker's counters. Answers at temperature 0."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, llama_manifest, wait_for
from tests.lazy_modules import lazy

openai = lazy("openai")
anthropic = lazy("anthropic")

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "The capital of France is"}]


@pytest.fixture(scope="module")
def loras(tmp_path_factory, demo_gguf):
    from tests.lora_fixtures import shared_lora, write_broken_lora_gguf

    broken = tmp_path_factory.mktemp("broken") / "broken.gguf"
    write_broken_lora_gguf(broken, demo_gguf, flaw="architecture")
    return {"a": shared_lora(tmp_path_factory, "smol-a", 0),
            "b": shared_lora(tmp_path_factory, "smol-b", 1), "broken": broken}


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf, loras):
    # one llama.cpp slot: two sequences decoded in one batch round differently from one alone
    # (another matrix kernel), which can flip a greedy tie late in an answer, adapter or not
    base = llama_manifest("smol", demo_gguf, parallel=1, ctx_size=2048, adapters=[
        {"id": "smol-sql", "path": str(loras["a"])},
        {"id": "smol-poet", "path": str(loras["b"]), "aliases": ["poet"]},
        {"id": "smol-broken", "path": str(loras["broken"])},
        {"id": "smol-gone", "path": str(loras["a"].parent / "nowhere.gguf")}])
    drafted = llama_manifest("smol-fast", demo_gguf, draft=str(demo_gguf), draft_max=8)
    srv = ServerProcess(tmp_path_factory.mktemp("adapters"), {}, [base, drafted])
    srv.start()
    yield srv
    srv.stop()


# every prompt computed whole: a prompt partly read from llama.cpp's cache is computed in
# other batches than one read whole, which rounds differently and can flip a late greedy tie
WHOLE = {"cache_prompt": False}


def answer(server, model: str, **extra) -> str:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=12,
                                           temperature=0, seed=1, extra_body=WHOLE, **extra)
    return reply.choices[0].message.content


def slots(server) -> list[dict]:
    return server.status()["slots"]


def test_each_adapter_answers_as_itself_on_one_worker(server):
    base = answer(server, "smol")
    sql, poet = answer(server, "smol-sql"), answer(server, "poet")
    assert len({base, sql, poet}) == 3, (base, sql, poet)
    pid = next(s["pid"] for s in slots(server) if s["model"] == "smol")
    # in turn, back and forth: the same answers, no load, no second process
    assert [answer(server, m) for m in ("smol-sql", "smol", "poet", "smol-sql", "smol")] == \
        [sql, base, poet, sql, base]
    smol = next(s for s in slots(server) if s["model"] == "smol")
    assert smol["pid"] == pid and smol["loads"] == 1
    assert smol["adapters"] == ["smol-sql", "smol-poet"]
    assert {s["model"] for s in slots(server)} <= {"smol", "smol-fast"}  # no adapter slots


def test_adapters_at_once_keep_their_answers(server):
    """Six requests sent at once for the base and both adapters: each answers as it does
    alone (the worker takes them in turn; none sees another's adapter)."""
    alone = {m: answer(server, m) for m in ("smol", "smol-sql", "smol-poet")}

    async def together() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        replies = await asyncio.gather(*[
            client.chat.completions.create(model=m, messages=PROMPT, max_tokens=12,
                                           temperature=0, seed=1, extra_body=WHOLE)
            for m in ("smol", "smol-sql", "smol-poet") * 2])
        return [r.choices[0].message.content for r in replies]

    assert asyncio.run(together()) == list(alone.values()) * 2


def test_the_adapters_answer_is_llama_cpps_own(server, loras, demo_gguf, tmp_path):
    """The adapter applied per request answers as llama.cpp's server started with that
    adapter applied to everything."""
    port = free_port()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([sys.executable, "-m", "workers.llama", "--model", str(demo_gguf),
                               "--port", str(port), "--ctx-size", "2048", "--threads", "1",
                               "--lora", str(loras["a"])], stdout=log, stderr=log)
    try:
        def up() -> bool:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120, interval=0.2)
        own = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "messages": PROMPT, "max_tokens": 12, "temperature": 0, "seed": 1, **WHOLE}).json()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert answer(server, "smol-sql") == own["choices"][0]["message"]["content"]


def test_every_api_names_the_adapter(server):
    models = httpx.get(server.url + "/v1/models").json()["data"]
    card = next(m for m in models if m["id"] == "smol-sql")
    assert card["base"] == "smol" and "base" not in next(m for m in models if m["id"] == "smol")
    tags = {t["name"]: t for t in httpx.get(server.url + "/api/tags").json()["models"]}
    assert tags["smol-poet"]["details"]["parent_model"] == "smol"
    shown = httpx.post(server.url + "/api/show", json={"model": "smol-sql"}).json()
    assert "FROM smol" in shown["modelfile"] and "ADAPTER" in shown["modelfile"]
    ollama = httpx.post(server.url + "/api/chat", timeout=120, json={
        "model": "smol-sql", "messages": PROMPT, "stream": False,
        "options": {"temperature": 0, "seed": 1, "num_predict": 12}}).json()
    assert ollama["message"]["content"]
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    said = {m: client.messages.create(model=m, max_tokens=12, messages=PROMPT,
                                      extra_body={"temperature": 0, **WHOLE}).content[0].text
            for m in ("smol", "smol-poet", "smol-sql")}
    assert len(set(said.values())) == 3, said  # each its own, on Anthropic's route too


def test_a_broken_or_missing_adapter_is_unavailable_and_its_base_serves(server):
    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert not models["smol-broken"]["available"]
    assert "llama" in models["smol-broken"]["unavailable_reason"]  # the architecture named
    assert "not found" in models["smol-gone"]["unavailable_reason"]
    refused = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": "smol-broken", "messages": PROMPT, "max_tokens": 2})
    assert refused.status_code == 503, refused.text
    assert answer(server, "smol")  # the base loaded without it


def test_the_draft_model_is_counted_by_its_worker(server):
    plain, fast = answer(server, "smol"), answer(server, "smol-fast")
    assert fast == plain  # a draft changes the speed, never the answer
    status = httpx.get(server.url + "/api/v1/models/smol-fast/status").json()
    figures = status["draft_figures"]
    assert figures["drafted_tokens"] > 0 and figures["acceptance_rate"] >= 0.9, figures
    assert status["draft"]


def test_an_adapter_file_in_the_models_folder_is_found_with_its_base(make_server, demo_gguf,
                                                                      loras, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(demo_gguf)
    shutil.copy(loras["a"], models / "smol.sql.gguf")
    (models / "smol.adapters").mkdir()
    shutil.copy(loras["b"], models / "smol.adapters" / "poet.gguf")
    (models / "loras").mkdir()  # found by the base model its header names
    shutil.copy(loras["a"], models / "loras" / "by-header.gguf")
    srv = make_server({"models_dir": str(models), "discover": True})
    listed = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert listed["smol.sql"]["base"] == "smol" and listed["poet"]["base"] == "smol"
    assert listed["by-header"]["base"] == "smol"
    assert listed["smol"].get("base") is None and listed["smol"]["available"]
    assert answer(srv, "poet") != answer(srv, "smol")


def test_the_dashboard_shows_the_adapters_on_their_base(server):
    """The base's card lists its adapters; each adapter's card says which model it runs on
    and shows that worker's state."""
    from tests.e2e.chromium import playwright_and_chromium

    sync_api, chromium = playwright_and_chromium()
    answer(server, "smol-sql")  # the base is loaded
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page()
            page.goto(server.url + "/ui/")
            base = page.locator("article.model[data-model='smol']")
            sync_api.expect(base.locator("dd.adapters")).to_have_text("smol-sql, smol-poet")
            adapter = page.locator("article.model[data-model='smol-sql']")
            sync_api.expect(adapter.locator("dd.base")).to_have_text("smol")
            sync_api.expect(adapter).to_have_attribute("data-state", "ready")
        finally:
            browser.close()
