"""The dashboard after real traffic: ``scripts/scripted_minute.py`` (shortened) drives three
models that take turns on one declared GPU, a training job's lease and two clients at
different priorities against a real coordinator; the page, in headless Chromium, then tells
who held the VRAM, every load and eviction in order with its reason, and each client's waits,
matching what the coordinator's own event log says happened."""

from __future__ import annotations

import time

import httpx
import pytest

from scripts import scripted_minute as scripted
from tests.e2e.chromium import playwright_and_chromium

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()

expect = sync_api.expect
SECONDS = 12


@pytest.fixture(scope="module")
def after_traffic(tmp_path_factory, demo_gguf):
    """A coordinator after the shortened script: (server, what the script saw, events)."""
    from tests.conftest import ServerProcess

    config = {key: value for key, value in scripted.settings(0, tmp_path_factory.mktemp("x"),
                                                             tmp_path_factory.mktemp("y")).items()
              if key in ("gpus", "history_step_s")}
    server = ServerProcess(tmp_path_factory.mktemp("traffic"), config,
                           scripted.manifests(demo_gguf))
    server.start()
    try:
        seen = scripted.drive(server.url, SECONDS, until_all_loaded=True)
        time.sleep(1.5)  # one more timeline point (one a second) after the last answer
        events = httpx.get(server.url + "/api/v1/events?stream=false&limit=1000",
                           timeout=10).json()["events"]
        yield server, seen, events
    finally:
        server.stop()


def test_the_page_tells_who_held_the_vram_why_each_eviction_and_each_clients_waits(
        after_traffic):
    server, seen, events = after_traffic
    loads = [e["model"] for e in events if e["type"] == "loaded"]
    # the script did what it says: every model loaded, models evicted for one another
    story = [(round(e["ts"], 1), e["type"], e.get("model"), e.get("reason"))
             for e in events if e["type"] in ("loaded", "evicted", "unloaded")]
    assert set(loads) == set(scripted.MODELS), (seen, story)
    assert any(e["type"] == "evicted" for e in events) and seen["lease"] is not None, story
    assert seen["ok"] == seen["sent"] and set(seen["ok"]) == set(scripted.CLIENTS), seen
    assert sum(seen["ok"].values()) <= 100, seen  # the page sums the last 100 requests
    happened = [mark for mark in map(as_mark, events) if mark is not None]

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url + "/ui/")
        marks = page.locator(".marks-list li")
        expect(marks.first).to_be_visible(timeout=15_000)
        # who held the VRAM: each model and the training job's lease, as layers of GPU 0
        holders = page.locator("figure[data-gpu='0'] path[data-holder]")
        expect(holders.first).to_be_attached()
        drawn = set(holders.evaluate_all("els => els.map(e => e.dataset.holder)"))
        assert {f"model:{m}" for m in scripted.MODELS} | {"lease:trainer"} <= drawn, drawn
        legend = page.locator("figure[data-gpu='0'] .legend").inner_text()
        assert all(m in legend for m in scripted.MODELS) and "trainer" in legend, legend

        # every load and eviction, in the order the event log has them, each eviction with
        # why: the model it made room for, or idle when its stay-warm ran out
        listed = marks.evaluate_all("""els => els.map(e => ({type: e.dataset.type,
            model: e.dataset.model, text: e.textContent}))""")
        shown = [m for m in reversed(listed) if m["type"] in ("load", "evict")]  # newest first
        # the list holds the last 50 marks; the first request's load came before the timeline's
        # first point and is listed too
        assert len(shown) == min(len(happened), 50), (listed, story)
        happened = happened[-len(shown):]
        assert [(m["type"], m["model"]) for m in shown] == [
            (kind, model) for kind, model, _ in happened], (listed, story)
        for (kind, model, why), mark in zip(happened, shown, strict=True):
            if kind == "evict":
                assert f"{model} evicted" in mark["text"] and why in mark["text"], (mark, why)

        # each client's waits, from the request log: both clients, their priorities, counts
        rows = page.locator("#client-waits tbody tr")
        expect(rows).to_have_count(2)
        table = {row.get_attribute("data-client"): row.locator("td").all_inner_texts()
                 for row in rows.all()}
        for client, priority in scripted.CLIENTS.items():
            cells = table[client]
            assert cells[1] == str(priority) and int(cells[2]) == seen["ok"][client], table
            assert cells[3].endswith(" s") and cells[4].endswith(" s"), table
        # and the request rows themselves, both clients listed
        listed_clients = set(page.locator("#request-table tbody td:nth-child(3)")
                             .all_inner_texts())
        assert set(scripted.CLIENTS) <= listed_clients, listed_clients
        browser.close()


def as_mark(event: dict) -> tuple[str, str, str] | None:
    """What the page should list for an event of the coordinator's log: (type, model, why)."""
    reason = event.get("reason") or ""
    if event["type"] == "loaded":
        return "load", event["model"], ""
    if event["type"] == "evicted":  # "room for <model>"
        return "evict", event["model"], "for " + reason.removeprefix("room for ").strip("'")
    if event["type"] == "unloaded" and reason == "stay-warm expired":
        return "evict", event["model"], "idle"
    return None
