"""/docs (Swagger UI) and /redoc in headless Chromium with nothing reachable but the daemon:
every request the pages make stays on 127.0.0.1 (anything else is aborted, as on a box with
no internet), and they render the API's operations from the package's own copies of the
assets."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.e2e.chromium import playwright_and_chromium

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()
expect = sync_api.expect


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("docs"),
                        {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
                        [llama_manifest("smol", demo_gguf)])
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def offline_page():
    """A page whose every request off 127.0.0.1 is aborted; ``.left`` lists those asked for."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_context().new_page()
        page.left = []

        def only_here(route):
            if urlsplit(route.request.url).hostname == "127.0.0.1":
                route.continue_()
            else:
                page.left.append(route.request.url)
                route.abort("internetdisconnected")

        page.route("**/*", only_here)
        yield page
        browser.close()


def test_swagger_ui_renders_the_operations_offline(offline_page, server):
    offline_page.goto(server.url + "/docs")
    operations = offline_page.locator(".opblock-summary-path")
    expect(operations.first).to_be_visible(timeout=30_000)
    paths = set(operations.all_inner_texts())
    assert {"/v1/chat/completions", "/v1/models/{model_id}", "/v1/messages",
            "/api/chat"} <= {p.replace("\u200b", "") for p in paths}
    assert offline_page.left == []


def test_redoc_renders_the_operations_offline(offline_page, server):
    offline_page.goto(server.url + "/redoc")
    expect(offline_page.get_by_text("/v1/chat/completions").first).to_be_attached(
        timeout=30_000)
    assert offline_page.locator("[data-section-id^='tag/']").count() >= 3
    assert offline_page.left == []
