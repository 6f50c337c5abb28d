"""The dashboard's request rows link each request's trace: a real coordinator with traces on
(exporting to the suite's OTLP receiver) and ``tracing.trace_url`` in its config file, one
chat sent with a ``traceparent``, the Requests panel in headless Chromium."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.e2e.chromium import playwright_and_chromium
from tests.otlp_receiver import Receiver, tracing_env

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()
expect = sync_api.expect

TRACE_ID = "9df92f3577b34da6a3ce929d0e0e4741"
VIEWER = "http://traces.example/trace/{trace_id}"


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    receiver = Receiver()
    srv = ServerProcess(tmp_path_factory.mktemp("tracing-dashboard"),
                        {"tracing": {"trace_url": VIEWER}},
                        [llama_manifest("smol", demo_gguf)], env=tracing_env(receiver))
    srv.start()
    yield srv
    srv.stop()
    receiver.close()


def test_a_request_row_links_its_trace(server):
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=120, headers={
        "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}, json={
        "model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    listed = httpx.get(server.url + "/api/v1/requests", timeout=10).json()
    assert listed["trace_url"] == VIEWER
    assert [row["trace_id"] for row in listed["requests"]] == [TRACE_ID]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page()
            page.goto(server.url + "/ui")
            link = page.locator("#request-table tbody tr a.trace-id")
            expect(link).to_have_count(1)
            expect(link).to_have_attribute("href", VIEWER.format(trace_id=TRACE_ID))
            expect(link).to_have_attribute("title", TRACE_ID)
            expect(link).to_have_text(TRACE_ID[:8])
        finally:
            browser.close()
