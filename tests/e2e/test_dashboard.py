"""The dashboard at /ui in headless Chromium (Debian's package, driven by Playwright's Python
API) against a real coordinator serving the demo GGUF under two manifests on a declared GPU."""

from __future__ import annotations

import json
import re
import socket
import threading
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.e2e.chromium import playwright_and_chromium

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()

expect = sync_api.expect
GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]}
LOAD_S = 120_000  # ms: a cold load on a busy 2-core machine


def two_models(gguf) -> list[dict]:
    return [llama_manifest("smol-a", gguf, aliases=["smol-a:135m"]),
            llama_manifest("smol-b", gguf)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("dashboard"), GPU, two_models(demo_gguf))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


# Records each load stage the page shows on one model's card, in order.
STAGE_WATCH = """model => {
  window.stagesSeen = [];
  new MutationObserver(() => {
    const shown = document.querySelector(`article.model[data-model='${model}'] .progress`);
    const stage = shown?.dataset.stage;
    if (stage && window.stagesSeen.at(-1) !== stage) window.stagesSeen.push(stage);
  }).observe(document.getElementById("model-list"), {subtree: true, childList: true});
}"""


def card(page, model: str):
    return page.locator(f"article.model[data-model='{model}']")


# Installed before the page's own scripts: what each panel holds the moment the document is
# parsed and its scripts have run, before any timer, fetch or event could fill it.
AT_LOAD = """document.addEventListener("DOMContentLoaded", () => {
  const text = (selector) => document.querySelector(selector)?.innerText.trim() ?? "";
  window.atLoad = {
    gpus: document.querySelectorAll("#gpu-list article.gpu").length,
    gpuSummary: text("#gpu-summary"),
    leases: text("#lease-table tbody"),
    queue: text("#queue-summary") + " | " + text("#queue-table tbody"),
    config: document.querySelectorAll("#config-fields input").length,
    models: document.querySelectorAll("#model-list article.model").length,
  };
});"""


def outside_lease(server, **terms) -> dict:
    taken = httpx.post(server.url + "/api/v1/leases", json={
        "kind": "training", "vram_mb": 256, "gpu": 0, "ttl_s": 300, **terms})
    taken.raise_for_status()
    return taken.json()


def test_first_paint_shows_every_panel(browser, server, tmp_path):
    """No empty box at load: the page comes with the first status snapshot and draws every
    panel from it before its first paint, not after a timer or a fetch."""
    lease = outside_lease(server, holder="trainer-7", note="nightly eval")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(AT_LOAD)
    try:
        page = context.new_page()
        page.goto(server.url + "/ui", wait_until="domcontentloaded")
        at_load = page.evaluate("window.atLoad")
        page.screenshot(path=str(tmp_path / "first-paint.png"))
        assert at_load["gpus"] == 1 and "1 GPU" in at_load["gpuSummary"], at_load
        assert "trainer-7" in at_load["leases"], at_load
        assert "waiting" in at_load["queue"] and "Nothing waiting." in at_load["queue"], at_load
        assert at_load["config"] >= 1 and at_load["models"] == 2, at_load
    finally:
        context.close()
        httpx.delete(f"{server.url}/api/v1/leases/{lease['id']}")


def test_outside_lease_shows_the_holder_it_was_taken_with(page, server):
    lease = outside_lease(server, holder="trainer-7", note="nightly eval")
    try:
        page.goto(server.url + "/ui")
        row = page.locator(f"#lease-table tr[data-lease='{lease['id']}']")
        expect(row.locator("td").first).to_have_text("trainer-7 from 127.0.0.1")
        expect(row).to_contain_text("nightly eval")
        expect(page.locator("article.gpu[data-gpu='0'] .legend")).to_contain_text(
            "training: nightly eval · trainer-7")
        assert [(held["holder"], held["address"]) for held in server.status()["leases"]
                if held["id"] == lease["id"]] == [("trainer-7", "127.0.0.1")]
    finally:
        httpx.delete(f"{server.url}/api/v1/leases/{lease['id']}")


def test_page_renders_gpus_models_and_their_states(page, server):
    page.goto(server.url + "/ui")
    expect(page.locator("#live")).to_have_text("live")
    gpu = page.locator("article.gpu[data-gpu='0']")
    expect(gpu.locator("h3")).to_have_text("GPU 0 · sim-8g")
    expect(gpu.locator(".badge")).to_have_text("declared")
    expect(gpu.locator(".legend")).to_contain_text("free 7.5 GB")  # 8 GB less the margin
    expect(gpu.locator(".legend")).to_contain_text("reserved 512 MB")
    expect(page.locator("#gpu-summary")).to_contain_text("declared in settings (simulated)")
    for model in ("smol-a", "smol-b"):
        expect(card(page, model).locator(".badge.state")).to_have_text("idle")
        expect(card(page, model).locator(".badge.tier")).to_have_text("disk")
        expect(card(page, model).locator(".vram")).to_contain_text("est.")
        expect(card(page, model).locator(".requests")).to_contain_text("0 queued")
    expect(card(page, "smol-a")).to_contain_text("smol-a:135m")
    expect(page.locator("#config-form input[name='allowCloudFallback']")).to_be_checked()
    expect(page.locator("#event-table")).to_contain_text("started")


def test_load_from_the_page_and_updates_from_events(page, server):
    page.goto(server.url + "/ui")
    expect(page.locator("#live")).to_have_text("live")
    page.evaluate("window.notReloaded = true")

    page.evaluate(STAGE_WATCH, "smol-a")
    page.get_by_role("button", name="Load smol-a", exact=True).click()
    # load_progress events: the stage shows while it loads, and "ready" for a while after
    expect(card(page, "smol-a").locator(".progress")).to_be_visible()
    expect(card(page, "smol-a")).to_have_attribute("data-state", "ready", timeout=LOAD_S)
    page.wait_for_function("window.stagesSeen.includes('ready')")
    stages = page.evaluate("window.stagesSeen")
    assert stages[-1] == "ready" and set(stages) <= {"leasing", "starting", "loading",
                                                      "warming", "ready"}, stages
    expect(card(page, "smol-a").locator(".placement")).to_contain_text("GPU 0")
    expect(card(page, "smol-a").locator(".placement")).to_contain_text("all layers on GPU")
    expect(card(page, "smol-a").locator(".placement")).to_contain_text("100% GPU (declared)")
    expect(card(page, "smol-a").locator(".keep-alive")).to_contain_text("unloads in")
    expect(card(page, "smol-a").locator(".vram")).to_contain_text("measured")
    expect(page.locator("article.gpu[data-gpu='0'] .legend")).to_contain_text("smol-a")
    expect(page.locator("#lease-table")).to_contain_text("smol-a")
    assert {s["model"]: s["state"] for s in server.status()["slots"]}["smol-a"] == "ready"

    # A load the page did not start shows up from the events stream, without a reload.
    loaded = threading.Event()
    threading.Thread(target=lambda: (httpx.post(server.url + "/api/v1/models/smol-b/load",
                                                timeout=LOAD_S / 1000), loaded.set()),
                     daemon=True).start()
    expect(card(page, "smol-b")).to_have_attribute("data-state", "ready", timeout=LOAD_S)
    assert page.evaluate("window.notReloaded") is True

    page.select_option("#event-type", "load_progress")
    expect(page.locator("#event-table tbody tr").first).to_contain_text("stage=ready")
    page.select_option("#event-type", "loaded")
    rows = page.locator("#event-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("smol-b")  # newest first
    page.fill("#event-model", "smol-a")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("smol-a")

    page.get_by_role("button", name="Unload smol-a", exact=True).click()
    expect(card(page, "smol-a")).to_have_attribute("data-state", "idle", timeout=30_000)
    expect(card(page, "smol-a").locator(".badge.tier")).to_have_text("disk")
    assert loaded.wait(LOAD_S / 1000)


def test_queue_and_outside_lease(page, server):
    """A request that cannot be placed (the GPU is a training job's, the other model pinned)
    waits in the queue; the page lists it, and drops it when its client goes away."""
    admin = httpx.Client(base_url=server.url, timeout=30)
    admin.post("/api/v1/models/smol-b/pin").raise_for_status()
    free = server.status()["gpus"][0]["free_mb"]
    lease = admin.post("/api/v1/leases", json={"kind": "training", "vram_mb": free, "gpu": 0,
                                               "ttl_s": 300, "note": "finetune run"}).json()
    body = json.dumps({"model": "smol-a", "max_tokens": 4, "x_client_id": "queue-test",
                       "x_priority": 3, "messages": [{"role": "user", "content": "hi"}]})
    client = socket.create_connection(("127.0.0.1", server.port))
    try:
        page.goto(server.url + "/ui")
        expect(page.locator("article.gpu[data-gpu='0'] .legend")).to_contain_text(
            "training: finetune run")
        expect(page.locator("#lease-table")).to_contain_text("finetune run")
        client.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                       f"\r\n{body}".encode())
        row = page.locator("#queue-table tbody tr[data-model='smol-a']")
        expect(row).to_contain_text("queue-test", timeout=15_000)
        expect(row.locator("td").nth(2)).to_have_text("3")
        expect(card(page, "smol-a").locator(".requests")).to_contain_text("1 queued")
        expect(row).to_contain_text("/v1/chat/completions")  # from GET /api/v1/queue
        client.close()  # the client goes away: it leaves the queue, and the page says so
        expect(page.locator("#queue-table tbody")).to_contain_text("Nothing waiting.",
                                                                 timeout=15_000)
        expect(card(page, "smol-a").locator(".requests")).to_contain_text("0 queued")
    finally:
        client.close()
        admin.delete(f"/api/v1/leases/{lease['id']}")
        admin.post("/api/v1/models/smol-b/unpin")
        admin.close()


class CuttableProxy:
    """A TCP proxy in front of the server whose open connections the test can cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        while self.open:
            sock = self.open.pop()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_stream_reconnects_after_a_drop_without_repeating_events(page, server):
    proxy = CuttableProxy(server.port)
    try:
        page.goto(proxy.url + "/ui")
        expect(page.locator("#live")).to_have_text("live")
        page.evaluate("window.notReloaded = true")
        started = page.locator("#event-table tbody tr[data-type='started']")
        expect(started).to_have_count(1)
        proxy.cut()
        expect(page.locator("#live")).to_have_text("reconnecting…")
        expect(page.locator("#live")).to_have_text("live", timeout=15_000)
        httpx.post(server.url + "/api/v1/models/smol-a/pin").raise_for_status()
        expect(page.locator("#event-table tbody tr[data-type='pinned']").first).to_contain_text(
            "smol-a")
        expect(started).to_have_count(1)  # resumed with ?since=, not replayed
        assert page.evaluate("window.notReloaded") is True
    finally:
        proxy.close()
        httpx.post(server.url + "/api/v1/models/smol-a/unpin").raise_for_status()


def test_phone_width_dark_theme_and_toggle(browser, server):
    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark",
                                  is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(server.url + "/ui")
        expect(card(page, "smol-b").locator(".actions button")).to_have_count(4)
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page scrolls sideways on a phone: {width}"
        background = "getComputedStyle(document.body).backgroundColor"
        assert page.evaluate(background) == "rgb(15, 18, 23)"  # dark from the system
        page.get_by_role("button", name="Light theme").click()
        assert page.evaluate(background) == "rgb(246, 247, 249)"
        expect(page.get_by_role("button", name="Dark theme")).to_have_attribute(
            "aria-pressed", "false")
    finally:
        context.close()


def test_admin_key_is_asked_for_and_kept_in_the_session_only(browser, tmp_path_factory,
                                                              demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("dashboard-key"),
                        {**GPU, "admin_api_key": "s3cret-admin"}, two_models(demo_gguf))
    srv.start()
    context = browser.new_context()
    try:
        page = context.new_page()
        assert page.goto(srv.url + "/ui").ok  # the page itself needs no key
        expect(page.locator("#snapshot")).to_have_count(0)  # nor says anything without one
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        page.fill("#key-input", "wrong")
        page.click("#key-save")
        expect(dialog).to_be_visible()
        expect(page.locator("#key-why")).to_contain_text("refused")
        page.fill("#key-input", "s3cret-admin")
        page.keyboard.press("Enter")
        expect(card(page, "smol-b").locator(".badge.state")).to_have_text("idle")
        expect(page.locator("#live")).to_have_text("live")
        assert page.evaluate("sessionStorage.getItem('model-boss-admin-key')") == "s3cret-admin"
        assert "s3cret-admin" not in page.evaluate("JSON.stringify(localStorage)")

        page.get_by_role("button", name="Pin smol-b", exact=True).focus()
        page.keyboard.press("Enter")  # by keyboard; focus stays on the toggle as it flips
        expect(card(page, "smol-b").locator(".badge.pinned")).to_have_text("pinned")
        expect(page.get_by_role("button", name="Unpin smol-b", exact=True)).to_be_focused()
        page.uncheck("#config-form input[name='allowCloudFallback']")
        page.get_by_role("button", name="Save config").click()
        expect(page.locator("#notice")).to_have_text("Config saved.")
        admin = {"authorization": "Bearer s3cret-admin"}
        assert httpx.get(srv.url + "/api/v1/config", headers=admin).json() == {
            "allowCloudFallback": False}
        slot = httpx.get(srv.url + "/api/v1/models/smol-b/status", headers=admin).json()
        assert slot["pinned"] is True

    finally:
        context.close()
        srv.stop()


# ---------------------------------------------------------------- the panels that show time
def test_a_refusal_of_a_key_already_replaced_does_not_ask_again(browser, tmp_path_factory,
                                                                demo_gguf):
    """A wrong key, then the right one while a request sent with the wrong one is still on its
    way: that request's 401 comes after the right key is saved. It is sent again with the new
    key instead of asking once more (which left the page's status read waiting on a dialog,
    its panels "Loading…")."""
    srv = ServerProcess(tmp_path_factory.mktemp("dashboard-late-401"),
                        {**GPU, "admin_api_key": "s3cret-admin"}, two_models(demo_gguf))
    srv.start()
    context = browser.new_context()
    held = []

    def status_route(route):
        if route.request.headers.get("authorization") == "Bearer wrong":
            held.append(route)  # answered (401) only once the right key is in
        else:
            route.continue_()

    try:
        page = context.new_page()
        page.route("**/api/v1/status", status_route)
        assert page.goto(srv.url + "/ui").ok
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        page.fill("#key-input", "wrong")
        page.click("#key-save")
        expect(page.locator("#key-why")).to_contain_text("refused")  # the events stream's 401
        for _ in range(100):  # the page's status read with the wrong key reaches the route
            if held:
                break
            page.wait_for_timeout(50)  # (route handlers run while Playwright is called)
        assert held, "the status read with the wrong key was not held"
        page.fill("#key-input", "s3cret-admin")
        page.keyboard.press("Enter")
        expect(dialog).to_be_hidden()
        for route in held:
            route.continue_()  # the server refuses the wrong key now, too late to matter
        expect(card(page, "smol-b").locator(".badge.state")).to_have_text("idle")
        expect(dialog).to_be_hidden()
        expect(page.locator("#live")).to_have_text("live")
    finally:
        context.close()
        srv.stop()


# GET /api/v1/history and /api/v1/requests are stubbed with page.route: these tests are about
# what the page draws from answers of that shape, not about how the server keeps them.

HISTORY_T = [1_800_000_000 + 5 * i for i in range(10)]


def history_answer(marks: list[dict] | None = None) -> dict:
    held = {"model:smol-a": [0, 0, 900, 900, 900, 0, 0, 0, 0, 0],  # as the server names them
            "model:smol-b": [0, 0, 0, 0, 0, 0, 1200, 1200, 1200, 1200],
            "lease:trainer-7": [256] * 10}
    used = [sum(series[i] for series in held.values()) for i in range(10)]
    return {
        "step_s": 5, "now": HISTORY_T[-1], "t": HISTORY_T,
        "gpus": {"0": {"name": "sim-8g", "capacity_mb": 8192, "held": held,
                       "free_mb": [7680 - mb for mb in used]}},
        "queue": {"depth": {"0": [0, 1, 2, 0, 0, 0, 1, 0, 0, 0], "3": [0] * 9 + [1]},
                  "wait_s": {"0": [None, 0.5, 1.0] + [None] * 7, "3": [None] * 10}},
        "models": {"smol-a": {"requests_per_s": [0, 0, 0.2, 0.4, 0, 0, 0, 0, 0, 0],
                              "tokens_per_s": [0, 0, 8, 16, 0, 0, 0, 0, 0, 0]},
                   "smol-b": {"requests_per_s": [0] * 6 + [0.2] * 4,
                              "tokens_per_s": [0] * 6 + [12, 14, None, 10]}},
        "cpu_tier_mb": [0] * 10,
        # not in time order: the page sorts them
        "marks": marks if marks is not None else [
            {"t": HISTORY_T[5], "type": "evict", "model": "smol-a", "gpu": 0,
             "reason": "smol-b needed the room"},
            {"t": HISTORY_T[2], "type": "load", "model": "smol-a", "gpu": 0, "reason": None},
            {"t": HISTORY_T[6], "type": "load", "model": "smol-b", "gpu": 0, "reason": None}],
    }


REQUESTS = [
    {"t": HISTORY_T[8], "model": "smol-b", "client_id": "notebook", "priority": 0,
     "queue_wait_s": 0.1, "load_wait_s": 3.2, "duration_s": 1.5, "tokens": 40, "status": "ok",
     "task": "chat", "rung": "q4"},
    {"t": HISTORY_T[3], "model": "smol-a", "client_id": "ci", "priority": 3,
     "queue_wait_s": 0.0, "load_wait_s": 0.0, "duration_s": 0.7, "tokens": 12, "status": "ok",
     "task": "chat", "rung": None},
    {"t": HISTORY_T[2], "model": "smol-a", "client_id": "notebook", "priority": 0,
     "queue_wait_s": 2.0, "load_wait_s": 4.1, "duration_s": 0.9, "tokens": 0,
     "status": "error", "task": "chat", "rung": None},
]
REQUESTS_ROUTE = re.compile(r"/api/v1/requests(\?|$)")


def stub_time_routes(page, history: dict | None, requests: list[dict] | None) -> list[str]:
    """Answer the two reads from fixed JSON (None: 404, as a server without them); returns
    the request URLs the page asked for, as they come."""
    asked: list[str] = []
    missing = json.dumps({"error": {"message": "no such route", "type": "not_found",
                                    "param": None, "code": "not_found"}})

    def history_route(route):
        if history is None:
            route.fulfill(status=404, content_type="application/json", body=missing)
        else:
            route.fulfill(status=200, content_type="application/json", json=history)

    def requests_route(route):
        asked.append(route.request.url)
        if requests is None:
            route.fulfill(status=404, content_type="application/json", body=missing)
            return
        query = parse_qs(urlsplit(route.request.url).query)
        model = query.get("model", [""])[0]
        rows = [r for r in requests if not model or r["model"] == model]
        route.fulfill(status=200, content_type="application/json", json={"requests": rows})

    page.route("**/api/v1/history", history_route)
    page.route(REQUESTS_ROUTE, requests_route)
    return asked


MARKS = """() => [...document.querySelectorAll("#timeline-charts .mark")].map(
  (m) => [m.dataset.type, m.dataset.model, Number(m.dataset.t), Number(m.getAttribute("x1"))])"""


def test_timeline_draws_vram_by_holder_marks_in_order_and_live(page, server):
    history = history_answer()
    stub_time_routes(page, history, REQUESTS)
    # no events reach this page: the redraw below comes from its own re-read every 5 s
    page.route("**/api/v1/events*", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=": quiet\n\n"))
    page.goto(server.url + "/ui")
    gpu = page.locator("#timeline-charts figure[data-gpu='0']")
    areas = gpu.locator("path.area")
    expect(areas).to_have_count(4)
    assert [areas.nth(i).get_attribute("data-holder") for i in range(4)] == [
        "model:smol-a", "model:smol-b", "lease:trainer-7", "free"]  # free on top
    expect(gpu.locator("path.area.outside")).to_have_attribute("data-holder", "lease:trainer-7")
    expect(gpu.locator("path.area.model")).to_have_count(2)
    fills = {areas.nth(i).evaluate("el => getComputedStyle(el).fill") for i in range(4)}
    assert len(fills) == 4, fills  # each holder its own colour

    marks = page.evaluate(MARKS)
    assert [(kind, model, t) for kind, model, t, _ in marks] == [
        ("load", "smol-a", HISTORY_T[2]), ("evict", "smol-a", HISTORY_T[5]),
        ("load", "smol-b", HISTORY_T[6])]
    assert [x for *_, x in marks] == sorted(x for *_, x in marks) and marks[0][3] < marks[2][3]
    expect(gpu.locator(".mark[data-type='evict'] title")).to_contain_text(
        "evict · smol-a · smol-b needed the room")
    for chart in ("queue", "wait", "tokens", "requests"):  # two priorities, two models
        expect(page.locator(f"#timeline-charts figure[data-chart='{chart}'] path.series")
               ).to_have_count(2)
    expect(page.locator("#timeline-summary")).to_contain_text("3 marks")
    cpu_tier = page.locator("#timeline-charts figure[data-chart='cpu-tier']")
    expect(cpu_tier).to_have_count(0)  # nothing was ever parked

    # live: the panel re-reads the history on its own and draws what is new
    history["marks"].append({"t": HISTORY_T[9], "type": "crash", "model": "smol-b", "gpu": 0,
                             "reason": "exit 139"})
    history["cpu_tier_mb"] = [0] * 8 + [1500, 1500]
    expect(gpu.locator(".mark")).to_have_count(4, timeout=15_000)
    assert page.evaluate(MARKS)[-1][:2] == ["crash", "smol-b"]
    expect(cpu_tier.locator(".legend")).to_contain_text("CPU tier: 1500")
    newest = page.locator(".marks-list li").first  # in words, newest first
    expect(newest).to_contain_text("smol-b crashed on GPU 0 — exit 139")


def test_timeline_caps_the_points_it_draws(page, server):
    n = 3000
    t = [1_800_000_000 + 5 * i for i in range(n)]
    history = {**history_answer(marks=[]), "t": t,
               "gpus": {"0": {"name": "sim-8g", "capacity_mb": 8192,
                              "held": {"model:smol-a": [i % 2000 for i in range(n)]},
                              "free_mb": [7680 - i % 2000 for i in range(n)]}},
               "queue": {"depth": {"0": [i % 7 for i in range(n)]}, "wait_s": {}},
               "models": {"smol-a": {"requests_per_s": [1] * n, "tokens_per_s": [5] * n}}}
    stub_time_routes(page, history, REQUESTS)
    page.goto(server.url + "/ui")
    area = page.locator("#timeline-charts figure[data-gpu='0'] path.area").first
    expect(area).to_have_attribute("data-holder", "model:smol-a")
    points = area.get_attribute("d").count("L") + 1
    assert 2 * 100 < points <= 2 * 720, points  # top and bottom edge, each at most 720
    line = page.locator("#timeline-charts figure[data-chart='queue'] path.series")
    assert line.get_attribute("d").count("L") + 1 <= 720


def test_requests_panel_lists_rows_and_filters_by_model(page, server):
    asked = stub_time_routes(page, history_answer(), REQUESTS)
    page.goto(server.url + "/ui")
    rows = page.locator("#request-table tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("smol-b")  # newest first, as the server answers
    expect(rows.first).to_contain_text("notebook")
    expect(rows.first).to_contain_text("3.20 s")
    expect(rows.nth(2)).to_have_attribute("data-status", "error")
    page.fill("#request-model", "smol-a")
    expect(rows).to_have_count(2)
    assert all(row.get_attribute("data-model") == "smol-a" for row in rows.all())
    # the filter is also asked of the server, whose log may be longer than the rows shown
    for _ in range(50):
        if any(parse_qs(urlsplit(url).query).get("model") == ["smol-a"] for url in asked):
            break
        page.wait_for_timeout(100)
    else:
        pytest.fail(f"the model filter never reached the server: {asked}")
    page.fill("#request-model", "")
    page.fill("#request-client", "ci")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("smol-a")


def test_servers_without_history_say_so_and_the_rest_still_works(page, server):
    stub_time_routes(page, None, None)
    page.goto(server.url + "/ui")
    expect(page.locator("#timeline-summary")).to_have_text("no history on this server")
    expect(page.locator("#requests-summary")).to_have_text("no request log on this server")
    expect(page.locator("#timeline-charts svg")).to_have_count(0)
    expect(page.locator("#live")).to_have_text("live")
    gpu = page.locator("article.gpu[data-gpu='0']")
    expect(gpu.locator("h3")).to_have_text("GPU 0 · sim-8g")
    expect(gpu.locator(".legend")).to_contain_text("free")
    expect(card(page, "smol-a").locator(".badge.state")).to_have_text("idle")


# Stops the page's every-5-s timers, so what redraws it can only be the events stream.
NO_BACKSTOP = """const every = window.setInterval;
window.setInterval = (fn, ms, ...args) => (ms === 5000 ? 0 : every(fn, ms, ...args));"""


def test_timeline_rereads_on_the_events_stream(browser, server):
    context = browser.new_context()
    context.add_init_script(NO_BACKSTOP)
    try:
        page = context.new_page()
        history = history_answer()
        stub_time_routes(page, history, REQUESTS)
        page.goto(server.url + "/ui")
        expect(page.locator("#live")).to_have_text("live")
        marks = page.locator("#timeline-charts figure[data-gpu='0'] .mark")
        expect(marks).to_have_count(3)
        page.wait_for_timeout(1500)  # past the replayed events' read
        history["marks"].append({"t": HISTORY_T[9], "type": "offload", "model": "smol-b",
                                 "gpu": 0, "reason": "idle"})
        httpx.post(server.url + "/api/v1/models/smol-a/pin").raise_for_status()  # an event
        expect(marks).to_have_count(4)
        expect(marks.last).to_have_attribute("data-type", "offload")
    finally:
        context.close()
        httpx.post(server.url + "/api/v1/models/smol-a/unpin").raise_for_status()


# ---------------------------------------------------------------- the playground

def pick(page, model: str):
    """Choose a model in the playground's picker once /v1/models has filled it."""
    expect(page.locator(f"#pg-model option[value='{model}']")).to_have_count(1)
    page.select_option("#pg-model", model)


# Records the playground's state with Send's and Stop's disabled flags at each change.
BUTTONS_WATCH = """() => {
  const section = document.getElementById("playground");
  window.buttonsSeen = [];
  new MutationObserver(() => window.buttonsSeen.push([section.dataset.state,
    document.getElementById("pg-send").disabled, document.getElementById("pg-stop").disabled]))
    .observe(section, {attributes: true, attributeFilter: ["data-state"]});
}"""


def test_playground_round_trips_a_streamed_chat(page, server):
    """A real chat on the demo model through the page: the same public route and stream any
    client gets, the text drawn as it streams, the served model and its queue wait shown."""
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(r.post_data_json)
            if r.url.endswith("/v1/chat/completions") else None)
    page.goto(server.url + "/ui")
    pick(page, "smol-a")
    expect(page.locator("#pg-mode")).to_have_value("chat")  # from the model's category
    page.fill("#pg-message", "Write one short sentence about the sea.")
    page.fill("#pg-max-tokens", "12")
    page.evaluate(BUTTONS_WATCH)
    send = page.get_by_role("button", name="Send", exact=True)
    send.click()
    expect(page.locator("#playground")).to_have_attribute("data-state", "done", timeout=LOAD_S)
    # while it ran: Send off (one request at a time), Stop on
    assert ["running", True, False] in page.evaluate("window.buttonsSeen")
    assert page.locator("#pg-text").inner_text().strip(), "no streamed text drawn"
    expect(page.locator("#pg-error")).to_be_hidden()
    expect(page.locator("#pg-meta [data-fact='Served by']")).to_have_text("smol-a")
    expect(page.locator("#pg-meta [data-fact='Tokens']")).to_contain_text(re.compile(r"^\d+"))
    expect(page.locator("#pg-status")).to_contain_text("Done in")
    expect(send).to_be_enabled()
    # A stream that began while its model loaded has no queue-wait header (the wait was not
    # over yet); the model is warm now, so the next answer carries it.
    page.evaluate("document.getElementById('pg-text').textContent = ''")
    send.click()
    expect(page.locator("#pg-meta [data-fact='Queue wait']")).to_have_text(
        re.compile(r"^\d+\.\d\d s$"), timeout=LOAD_S)
    expect(page.locator("#playground")).to_have_attribute("data-state", "done", timeout=LOAD_S)
    assert page.locator("#pg-text").inner_text().strip(), "no streamed text the second time"
    assert sent and sent[0]["stream"] is True and sent[0]["model"] == "smol-a", sent
    assert sent[0]["max_tokens"] == 12 and sent[0]["messages"][0]["role"] == "user", sent


def test_playground_shows_a_routes_refusal_in_words(page, server):
    """Rerank asked of a chat model: the real server's 400 envelope message is shown, not a
    blank panel, and Send comes back."""
    page.goto(server.url + "/ui")
    pick(page, "smol-b")
    page.select_option("#pg-mode", "rerank")
    expect(page.locator("#pg-query")).to_be_visible()
    expect(page.locator("#pg-message")).to_be_hidden()
    page.get_by_role("button", name="Send", exact=True).click()
    error = page.locator("#pg-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("'smol-b' does not serve reranking")
    expect(error).to_contain_text("HTTP 400")
    expect(page.locator("#playground")).to_have_attribute("data-state", "error")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()


# a 1x1 PNG
PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAA"
         "AABJRU5ErkJggg==")


def test_playground_image_rerank_and_transcription_with_the_pages_key(browser, server):
    """The fixture has no diffusion, rerank or speech model: those answers are stubbed (the
    requests are what is checked), and each carries the key the page keeps."""
    context = browser.new_context()
    context.add_init_script("sessionStorage.setItem('model-boss-admin-key', 'pg-key')")
    seen: dict[str, dict] = {}

    def answer(name, body, headers=None):
        def handle(route):
            request = route.request
            seen[name] = {"auth": request.headers.get("authorization"),
                          "type": request.headers.get("content-type", ""),
                          "body": request.post_data_buffer}
            route.fulfill(status=200, content_type="application/json", json=body,
                          headers=headers or {})
        return handle

    try:
        page = context.new_page()
        page.route("**/v1/images/generations", answer(
            "image", {"created": 1, "data": [{"b64_json": PIXEL}]},
            {"x-model-boss-model": "sd-tiny", "x-model-boss-queue-wait-s": "0.25"}))
        page.route("**/v1/rerank", answer("rerank", {"results": [
            {"index": 2, "relevance_score": 0.91}, {"index": 0, "relevance_score": 0.12}]}))
        page.route("**/v1/audio/transcriptions", answer("stt", {"text": "hello from the sea"}))
        page.goto(server.url + "/ui")
        pick(page, "smol-a")
        send = page.get_by_role("button", name="Send", exact=True)

        page.select_option("#pg-mode", "image")
        page.fill("#pg-prompt", "a lighthouse")
        page.select_option("#pg-size", "64x64")
        page.fill("#pg-steps", "4")
        send.click()
        image = page.locator("#pg-output img")
        expect(image).to_have_attribute("src", f"data:image/png;base64,{PIXEL}")
        expect(image).to_have_attribute("alt", re.compile("a lighthouse"))
        expect(page.locator("#pg-meta [data-fact='Served by']")).to_have_text("sd-tiny")
        assert page.evaluate("document.querySelector('#pg-output img').naturalWidth") == 1
        body = json.loads(seen["image"]["body"])
        assert body == {"model": "smol-a", "prompt": "a lighthouse", "size": "64x64",
                        "response_format": "b64_json", "n": 1, "x_steps": 4}, body

        page.select_option("#pg-mode", "rerank")
        page.fill("#pg-query", "fruit")
        page.fill("#pg-documents", "an apple\n\na car\na pear\n")
        send.click()
        rows = page.locator("#pg-rerank tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0)).to_have_text(re.compile(r"2\s*0\.9100\s*a pear"))
        expect(rows.nth(1)).to_have_text(re.compile(r"0\s*0\.1200\s*an apple"))
        assert json.loads(seen["rerank"]["body"]) == {
            "model": "smol-a", "query": "fruit", "documents": ["an apple", "a car", "a pear"]}

        page.select_option("#pg-mode", "transcription")
        page.set_input_files("#pg-file", files=[
            {"name": "clip.wav", "mimeType": "audio/wav", "buffer": b"RIFF0000WAVEfmt "}])
        send.click()
        expect(page.locator("#pg-text")).to_have_text("hello from the sea")
        assert seen["stt"]["type"].startswith("multipart/form-data")
        assert b'name="model"' in seen["stt"]["body"] and b"clip.wav" in seen["stt"]["body"]
        assert {s["auth"] for s in seen.values()} == {"Bearer pg-key"}, seen
    finally:
        context.close()
