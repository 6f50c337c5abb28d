"""The dashboard's Usage panel in headless Chromium against a real coordinator: an admin key
and two managed keys send real chats to the demo GGUF (two manifests), and the panel shows
each key's requests and tokens per model as ``GET /api/v1/usage`` answers them, the totals,
the 30 days as bars per key, and the key list; a user key sees its own usage only.

Set MODEL_BOSS_SCREENSHOTS to a folder (``docs``) to keep the panel's light and dark
screenshots there."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.e2e.chromium import playwright_and_chromium

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()

expect = sync_api.expect
GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]}
ADMIN_KEY = "usage-admin"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
LOAD_S = 120  # a cold load on a busy 2-core machine
# who sends what: key -> the model of each chat
SENT = {"alice": ["smol-a", "smol-a"], "bob": ["smol-a", "smol-b", "smol-b"]}
FIGURES = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "images",
           "audio_seconds", "gpu_seconds", "vram_mb_seconds")


@pytest.fixture(scope="module")
def box(tmp_path_factory, demo_gguf):
    """(server, {key name: secret}) after every chat of SENT has been answered."""
    srv = ServerProcess(tmp_path_factory.mktemp("dashboard-usage"),
                        {**GPU, "admin_api_key": ADMIN_KEY},
                        [llama_manifest("smol-a", demo_gguf), llama_manifest("smol-b", demo_gguf)],
                        headers=ADMIN)
    srv.start()
    try:
        secrets = {}
        with srv.client() as admin:
            for name in SENT:
                created = admin.post("/api/v1/keys", json={"name": name})
                assert created.status_code == 201, created.text
                secrets[name] = created.json()["key"]
        for name, models in SENT.items():
            with httpx.Client(base_url=srv.url, timeout=LOAD_S,
                              headers={"authorization": f"Bearer {secrets[name]}"}) as client:
                for i, model in enumerate(models):
                    answer = client.post("/v1/chat/completions", json={
                        "model": model, "max_tokens": 4 + i,
                        "messages": [{"role": "user", "content": f"Say hi to {name}."}]})
                    assert answer.status_code == 200, answer.text
        yield srv, secrets
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


def usage(srv, headers: dict, **query) -> list[dict]:
    answer = httpx.get(srv.url + "/api/v1/usage", headers=headers, timeout=10,
                       params={"group_by": "key,model", **query})
    answer.raise_for_status()
    return answer.json()["rows"]


def page_with_key(browser, secret: str, **options):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **options)
    context.add_init_script(f"sessionStorage.setItem('model-boss-admin-key', {secret!r})")
    return context, context.new_page()


def shown_rows(page, selector: str = "#usage-table tbody tr[data-key]") -> dict:
    """Each table row as {(key, model): {field: value}}, from the cells' exact values."""
    return {(row["key"], row["model"]): row["cells"] for row in page.locator(selector).evaluate_all(
        """rows => rows.map(r => ({key: r.dataset.key, model: r.dataset.model,
             cells: Object.fromEntries([...r.querySelectorAll('td[data-field]')].map(
               td => [td.dataset.field, Number(td.dataset.value)]))}))""")}


def keep_screenshot(section, tmp_path: Path, name: str) -> None:
    section.screenshot(path=str(tmp_path / name))
    folder = os.environ.get("MODEL_BOSS_SCREENSHOTS")
    if folder:
        section.screenshot(path=str(Path(folder) / name))


def test_usage_panel_shows_each_keys_usage_as_the_ledger_tells_it(browser, box, tmp_path):
    srv, _ = box
    expected = usage(srv, ADMIN)
    assert {row["key"] for row in expected} == set(SENT), expected
    assert {(r["key"], r["model"]): r["requests"] for r in expected} == {
        ("alice", "smol-a"): 2, ("bob", "smol-a"): 1, ("bob", "smol-b"): 2}
    assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 for r in expected), expected

    context, page = page_with_key(browser, ADMIN_KEY)
    try:
        page.goto(srv.url + "/ui/")
        section = page.locator("#usage")
        section.scroll_into_view_if_needed()
        expect(page.get_by_role("button", name="Today")).to_have_attribute("aria-pressed", "true")
        rows = page.locator("#usage-table tbody tr[data-key]")
        expect(rows).to_have_count(len(expected))
        shown = shown_rows(page)
        for row in expected:
            cells = shown[(row["key"], row["model"])]
            for field in FIGURES:
                assert cells[field] == pytest.approx(row[field]), (field, row, cells)
        # what the eye reads: counts grouped, the key and model named
        first = page.locator("#usage-table tbody tr[data-key='bob'][data-model='smol-b']")
        expect(first.locator("th")).to_have_text("bob")
        expect(first.locator("td[data-field='requests']")).to_have_text("2")
        total = page.locator("#usage-table tfoot tr[data-total]")
        expect(total.locator("td[data-field='requests']")).to_have_text("5")
        assert float(total.locator("td[data-field='prompt_tokens']").get_attribute(
            "data-value")) == sum(r["prompt_tokens"] for r in expected)
        expect(page.locator("#usage-summary")).to_contain_text("Every key today: 5 requests")

        # the key list: every key, its scope and what it used today
        section.screenshot(path=str(tmp_path / "today.png"))
        keys = page.locator("#usage-keys tbody tr")
        expect(keys).to_have_count(3)  # the config file's admin key and the two managed ones
        alice = page.locator("#usage-keys tr[data-key='alice']")
        expect(alice.locator("td[data-field='requests']")).to_have_text("2")
        expect(alice).to_contain_text("user")
        expect(alice).to_contain_text("active")
        expect(page.locator("#usage-keys tr[data-key='admin']")).to_contain_text("admin")

        # 30 days: a bar per key on today's UTC day, in both charts, each as tall as its figure
        page.get_by_role("button", name="Last 30 days").click()
        expect(page.get_by_role("button", name="Last 30 days")).to_have_attribute(
            "aria-pressed", "true")
        today = datetime.now(UTC).date().isoformat()
        # each bar as the ledger tells its key's day: grouped as the chart is (summed once,
        # then rounded to the API's 6 decimals, not a sum of rows rounded per model)
        by_day = usage(srv, ADMIN, group_by="key,day")
        for chart, figure in (("gpu_seconds", lambda r: r["gpu_seconds"]),
                              ("tokens", lambda r: r["prompt_tokens"] + r["completion_tokens"])):
            svg = page.locator(f"#usage-charts figure[data-chart='{chart}'] svg")
            expect(svg.locator("g[data-bucket]")).to_have_count(30)
            day = svg.locator(f"g[data-bucket='{today}']")
            for key in SENT:
                own = sum(figure(r) for r in by_day if r["key"] == key and r["day"] == today)
                bar = day.locator(f"rect.usage-bar[data-key='{key}']")
                if own > 0:
                    expect(bar).to_have_count(1)
                    assert float(bar.get_attribute("data-value")) == pytest.approx(own)
                    assert float(bar.get_attribute("height")) >= 1
        tokens = page.locator("#usage-charts figure[data-chart='tokens'] rect.usage-bar")
        assert set(tokens.evaluate_all("els => els.map(e => e.dataset.key)")) == set(SENT)
        expect(page.locator("#usage-table tbody tr[data-key]")).to_have_count(len(expected))
        keep_screenshot(section, tmp_path, "dashboard-usage-light.png")

        # one key picked: its rows only; a key that sent nothing says so
        page.select_option("#usage-key", "alice")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-key", "alice")
        # the key list still tells every key's spend
        expect(page.locator("#usage-keys tr[data-key='bob'] td[data-field='requests']")
               ).to_have_text("3")
        page.select_option("#usage-key", "admin")
        expect(page.locator("#usage-table tbody")).to_contain_text("No usage in the last 30 days.")
        expect(page.locator("#usage-summary")).to_contain_text("No usage in the last 30 days")
        expect(page.locator("#usage-charts svg")).to_have_count(0)
    finally:
        context.close()


def test_usage_panel_dark(browser, box, tmp_path):
    srv, _ = box
    context, page = page_with_key(browser, ADMIN_KEY, color_scheme="dark")
    try:
        page.goto(srv.url + "/ui/")
        section = page.locator("#usage")
        page.get_by_role("button", name="Last 30 days").click()
        expect(page.locator("#usage-charts figure[data-chart='gpu_seconds'] rect.usage-bar")
               ).not_to_have_count(0)
        assert page.evaluate("getComputedStyle(document.querySelector('#usage'))"
                             ".backgroundColor") == "rgb(23, 27, 34)"  # the dark panel
        section.scroll_into_view_if_needed()
        keep_screenshot(section, tmp_path, "dashboard-usage-dark.png")
    finally:
        context.close()


def test_a_user_key_sees_its_own_usage_and_no_key_list(browser, box):
    srv, secrets = box
    own = usage(srv, {"authorization": f"Bearer {secrets['bob']}"})
    assert {row["key"] for row in own} == {"bob"}  # the server's scoping, which the page shows
    context, page = page_with_key(browser, secrets["bob"])
    try:
        page.goto(srv.url + "/ui/")
        # the admin panels ask for the admin key; the Usage panel reads with the user key
        expect(page.locator("#key-dialog")).to_be_visible()
        rows = page.locator("#usage-table tbody tr[data-key]")
        expect(rows).to_have_count(len(own))
        shown = shown_rows(page)
        assert set(shown) == {(r["key"], r["model"]) for r in own}
        for row in own:
            assert shown[(row["key"], row["model"])]["prompt_tokens"] == row["prompt_tokens"]
        expect(page.locator("#usage-summary")).to_contain_text("Your key's own usage today")
        expect(page.locator("#usage-keys-box")).to_be_hidden()
        expect(page.locator("#usage-key")).to_be_hidden()
        expect(page.locator("#usage-keys-summary")).to_contain_text("need an admin key")
    finally:
        context.close()


def test_a_server_without_the_ledger_says_so(browser, box):
    srv, _ = box
    context, page = page_with_key(browser, ADMIN_KEY)
    try:
        page.route("**/api/v1/usage?*", lambda route: route.fulfill(
            status=404, content_type="application/json", json={"error": {
                "message": "no such route", "type": "not_found", "param": None,
                "code": "not_found"}}))
        page.goto(srv.url + "/ui/")
        expect(page.locator("#usage-summary")).to_have_text("no usage ledger on this server")
        expect(page.locator("#usage-charts svg")).to_have_count(0)
        expect(page.locator("#live")).to_have_text("live")  # the rest of the page carries on
    finally:
        context.close()
