"""The dashboard with a model running as two replicas: a real coordinator on two declared GPUs
serves the demo GGUF with ``replicas: 2`` and one request at a time per replica; concurrent
chats start the second replica, and the page, in headless Chromium, shows both under the
model's card (key, state, GPU, active requests) and names the second one's lease ``smol#2``."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for
from tests.e2e.chromium import playwright_and_chromium

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()

expect = sync_api.expect
CONFIG = {"gpus": [{"index": 0, "vram_mb": 2048}, {"index": 1, "vram_mb": 2048}],
          "replica_scale_wait_s": 0.2}


def chat(url: str, n: int) -> int:
    answer = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "smol", "max_tokens": 48,
        "messages": [{"role": "user", "content": f"Count from {n} to {n + 40}."}]})
    return answer.status_code


def replicas_ready(server: ServerProcess) -> dict[str, dict] | None:
    slots = {s["key"]: s for s in server.status()["slots"] if s["model"] == "smol"}
    ready = {key for key, s in slots.items() if s["state"] == "ready"}
    return slots if {"smol", "smol#2"} <= ready else None


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("replicas"), CONFIG, [
        llama_manifest("smol", demo_gguf, vram_mb=800, replicas=2, parallel=1)])
    srv.start()
    yield srv
    srv.stop()


def test_the_page_shows_both_replicas_under_their_model(server):
    # concurrent chats: the first fills replica 1, the next wait past replica_scale_wait_s
    # and a second replica starts on the other GPU; another round if it has not yet
    deadline = time.monotonic() + 40
    with ThreadPoolExecutor(4) as pool:
        while replicas_ready(server) is None and time.monotonic() < deadline:
            codes = list(pool.map(lambda n: chat(server.url, n), range(4)))
            assert codes == [200] * 4, codes
    slots = wait_for(lambda: replicas_ready(server), timeout=5,
                     what=lambda: server.status()["slots"])
    gpus = {key: sorted(slot["lease"]["allocations"]) for key, slot in slots.items()}
    assert all(len(held) == 1 for held in gpus.values()), gpus
    assert gpus["smol"] != gpus["smol#2"], gpus  # one per GPU

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url + "/ui/")
        card = page.locator("article.model[data-model='smol']")
        expect(page.locator("article.model")).to_have_count(1)  # one card: the model's
        expect(card.locator(".replicas")).to_contain_text("2 replicas")
        rows = card.locator(".replica-list li")
        expect(rows).to_have_count(2)
        assert rows.evaluate_all("els => els.map(e => e.dataset.replica)") == ["smol", "smol#2"]
        for key in ("smol", "smol#2"):
            row = card.locator(f".replica-list li[data-replica='{key}']")
            expect(row.locator(".replica-key")).to_have_text(key)
            expect(row.locator(".badge")).to_have_text("ready")
            expect(row.locator(".replica-gpus")).to_have_text(re.compile(
                rf"^ GPU {gpus[key][0]} \d+ MB$"))
            expect(row).to_contain_text("0 active")
        expect(card.locator(".requests")).to_contain_text("0 active · 0/2 parallel slots")

        # the lease table and the GPU bars name each replica's lease by its key
        for key, slot in slots.items():
            lease = page.locator(f"#lease-table tr[data-lease='{slot['lease']['id']}']")
            expect(lease.locator("td").nth(2)).to_have_text(key)
            legend = page.locator(f"article.gpu[data-gpu='{gpus[key][0]}'] .legend li")
            expect(legend.filter(has_text=re.compile(rf"^{re.escape(key)} \d+ MB$"))
                   ).to_have_count(1)
        browser.close()
