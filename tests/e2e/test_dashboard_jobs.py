"""The dashboard's Jobs panel in headless Chromium against a real coordinator: chat jobs on
the demo GGUF (one finished, one running whose token count rises, one queued behind it and
cancelled from the page) and an image job on the tiny diffusers pipeline whose denoising
steps fill a ``<progress>``; rows newest first, as ``GET /api/v1/jobs`` tells them. A fixed
answer shows what no quick real job does: a finished video's MP4, a yielded job, a queued
job's place and start, a failure, and the 50-row cap. A user key sees its own jobs only.

Set MODEL_BOSS_SCREENSHOTS to a folder (``docs``) to keep the panel's screenshots there."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for
from tests.e2e.chromium import playwright_and_chromium

pytestmark = pytest.mark.slow

sync_api, CHROMIUM = playwright_and_chromium()

expect = sync_api.expect
GPU = {"gpus": [{"index": 0, "name": "sim", "vram_mb": 8192}]}
LOAD_S = 180  # a cold load (torch's imports for the diffusers worker) on a busy 2-core box
SEEN_MS = 15_000  # what the page shows follows the API within a read or two
# never ends on its own before it is cancelled: ignore_eos, and room for every token
LONG_CHAT = {"model": "smol", "max_tokens": 3000, "ignore_eos": True,
             "messages": [{"role": "user", "content": "Tell me a long story."}]}
SHORT_CHAT = {"model": "smol", "max_tokens": 4,
              "messages": [{"role": "user", "content": "Say hi."}]}


def smol(gguf) -> dict:
    # one request at a time: a second chat job waits in the queue behind the first
    return llama_manifest("smol", gguf, ctx_size=4096, parallel=1, vram_mb=3000)


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf, tiny_sd):
    srv = ServerProcess(tmp_path_factory.mktemp("dashboard-jobs"), GPU, [
        smol(demo_gguf),
        {"id": "tiny-sd", "category": "diffusion", "backend": "diffusers",
         "path": str(tiny_sd), "vram_mb": 3000}])
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


def submit(srv, endpoint: str, body: dict, headers: dict | None = None) -> str:
    answer = httpx.post(srv.url + "/api/v1/jobs", json={"endpoint": endpoint, "body": body},
                        headers=headers or {}, timeout=30)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def job(srv, job_id: str, headers: dict | None = None) -> dict:
    answer = httpx.get(f"{srv.url}/api/v1/jobs/{job_id}", headers=headers or {}, timeout=10)
    answer.raise_for_status()
    return answer.json()


def wait_status(srv, job_id: str, *statuses: str, timeout: float = LOAD_S,
                headers: dict | None = None) -> dict:
    return wait_for(lambda: (state := job(srv, job_id, headers))["status"] in statuses and state,
                    timeout=timeout, interval=0.1, what=lambda: job(srv, job_id, headers))


def row(page, job_id: str):
    return page.locator(f"#jobs-table tbody tr[data-job='{job_id}']")


def shown_ids(page) -> list[str]:
    return page.locator("#jobs-table tbody tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.job)")


def short(job_id: str) -> str:
    return job_id.removeprefix("job-")[:8]


def open_jobs(page, srv) -> None:
    page.goto(srv.url + "/ui/")
    page.locator("#jobs").scroll_into_view_if_needed()  # read every second while it is seen


def keep_screenshot(section, tmp_path: Path, name: str) -> None:
    section.screenshot(path=str(tmp_path / name))
    folder = os.environ.get("MODEL_BOSS_SCREENSHOTS")
    if folder:
        section.screenshot(path=str(Path(folder) / name))


def test_chat_jobs_running_finished_and_cancelled_from_the_page(page, server, tmp_path):
    done = submit(server, "/v1/chat/completions", SHORT_CHAT)
    wait_status(server, done, "succeeded")
    running = submit(server, "/v1/chat/completions", LONG_CHAT)
    wait_status(server, running, "running")
    waiting = submit(server, "/v1/chat/completions", LONG_CHAT)
    assert job(server, waiting)["queue_position"] == 1

    # opened while a request waits: the first snapshot carries the queue's count by priority
    open_jobs(page, server)
    expect(page.locator("#queue-table tbody tr[data-model='smol']")).to_have_count(1)
    expect(row(page, waiting)).to_have_count(1)
    ours = [i for i in shown_ids(page) if i in (done, running, waiting)]
    assert ours == [waiting, running, done]  # newest first

    # the finished one: its badge, the tokens it made, kind and model, nothing to cancel
    expect(row(page, done).locator(".badge")).to_have_text("succeeded")
    assert row(page, done).get_attribute("data-kind") == "chat"
    expect(row(page, done).locator("td").nth(1)).to_have_text("chat")
    expect(row(page, done).locator("td").nth(2)).to_have_text("smol")
    expect(row(page, done).locator("[data-tokens]")).to_contain_text("token")
    expect(row(page, done).get_by_role("button")).to_have_count(0)

    # the running one: its token count rises while the page reads it
    expect(row(page, running).locator(".badge")).to_have_text("running")
    tokens = row(page, running).locator("[data-tokens]")
    expect(tokens).to_have_count(1, timeout=SEEN_MS)
    first = int(tokens.get_attribute("data-tokens"))
    page.wait_for_function(
        """([id, n]) => Number(document.querySelector(
             `#jobs-table tr[data-job='${id}'] [data-tokens]`)?.dataset.tokens) > n""",
        arg=[running, first], timeout=SEEN_MS)
    assert f"{int(tokens.get_attribute('data-tokens'))} tokens" == tokens.inner_text()

    # the queued one: its place in the queue, and Cancel from the page
    expect(row(page, waiting).locator(".badge")).to_have_text("queued")
    expect(row(page, waiting).locator("[data-position]")).to_contain_text("#1")
    keep_screenshot(page.locator("#jobs"), tmp_path, "dashboard-jobs-light.png")
    page.get_by_role("button", name=f"Cancel job {short(waiting)}").click()
    wait_status(server, waiting, "cancelled", timeout=10)
    expect(row(page, waiting).locator(".badge")).to_have_text("cancelled")
    expect(row(page, waiting).get_by_role("button")).to_have_count(0)

    # and the running one, by keyboard
    cancel = page.get_by_role("button", name=f"Cancel job {short(running)}")
    cancel.focus()
    page.keyboard.press("Enter")
    assert wait_status(server, running, "cancelled", timeout=10)["status"] == "cancelled"
    expect(row(page, running).locator(".badge")).to_have_text("cancelled")
    expect(page.locator("#jobs-summary")).to_contain_text("cancelled")


def test_an_image_job_fills_its_progress_bar(page, server):
    image = submit(server, "/v1/images/generations", {
        "model": "tiny-sd", "prompt": "slow", "size": "128x128", "x_steps": 200})
    try:
        open_jobs(page, server)
        wait_for(lambda: job(server, image)["progress"].get("step"), timeout=LOAD_S,
                 interval=0.1, what=lambda: job(server, image))
        shown = row(page, image)
        expect(shown.locator(".badge")).to_have_text("running", timeout=SEEN_MS)
        bar = shown.locator("progress")
        expect(bar).to_have_attribute("max", "200")
        page.wait_for_function(
            """id => Number(document.querySelector(
                 `#jobs-table tr[data-job='${id}'] progress`)?.value) > 0""",
            arg=image, timeout=SEEN_MS)
        step = int(float(bar.get_attribute("value")))
        assert 0 < step <= 200
        assert bar.get_attribute("aria-label").startswith(f"job {short(image)} progress: step ")
        assert shown.get_attribute("data-kind") == "image"
        expect(shown.locator("td").nth(2)).to_have_text("tiny-sd")
    finally:
        httpx.delete(f"{server.url}/api/v1/jobs/{image}", timeout=30)
    expect(row(page, image).locator(".badge")).to_have_text("cancelled", timeout=SEEN_MS)


def fixed_answer(now: float) -> list[dict]:
    """61 jobs, oldest first as the API lists them: 57 finished chats, then a failed speech
    job, a queued picture with its place, a running video that yielded twice and, newest, a
    finished video."""
    def one(i: int, **fields) -> dict:
        return {"id": "job-" + hashlib.sha1(str(i).encode()).hexdigest()[:20],
                "endpoint": "/v1/chat/completions", "client_id": "t",
                "status": "succeeded", "model": "smol", "progress": {"tokens": 5},
                "timings": {}, "result": None, "error": None, "created_at": now - 600 + i,
                "finished_at": now - 590 + i, "member": None, "yields": 0,
                "queue_position": None, "estimated_start": None, **fields}
    start = datetime.fromtimestamp(now + 90, UTC).isoformat(timespec="milliseconds")
    return [*(one(i) for i in range(57)),
            one(57, endpoint="/v1/audio/speech", status="failed", progress={},
                error={"message": "the voice is missing", "status": 400}),
            one(58, endpoint="/v1/images/generations", status="queued", model=None,
                progress={}, finished_at=None, queue_position=2, estimated_start=start),
            one(59, endpoint="/v1/videos", status="running", model="tiny-wan",
                progress={"step": 3, "steps": 8}, finished_at=None, yields=2),
            one(60, endpoint="/v1/videos", status="succeeded", model="tiny-wan",
                progress={"step": 8, "steps": 8})]


def test_videos_yields_places_failures_and_the_row_cap(browser, server, tmp_path):
    jobs = fixed_answer(time.time())
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
    try:
        page = context.new_page()
        page.route("**/api/v1/jobs", lambda route: route.fulfill(json={"jobs": jobs}))
        open_jobs(page, server)
        expect(page.locator("#jobs-table tbody tr[data-job]")).to_have_count(50)
        newest = [j["id"] for j in reversed(jobs)][:50]
        assert shown_ids(page) == newest
        expect(page.locator("#jobs-summary")).to_have_text(
            "61 jobs: 1 running · 1 queued · 58 succeeded · 1 failed"
            " · the newest 50 shown, 11 more not shown")

        video = row(page, jobs[60]["id"])
        link = video.get_by_role("link", name="MP4")
        expect(link).to_have_attribute("href", f"/v1/videos/video_{jobs[60]['id']}/content")
        expect(video.locator("td").nth(1)).to_have_text("video")
        expect(video.locator("progress")).to_have_attribute("value", "8")

        yielded = row(page, jobs[59]["id"])
        expect(yielded.locator(".yields")).to_have_text("yielded 2×")
        expect(yielded.locator("progress")).to_have_attribute(
            "aria-label", f"job {short(jobs[59]['id'])} progress: step 3 of 8")
        expect(yielded.get_by_role("button", name="Cancel job")).to_have_count(1)
        expect(yielded.get_by_role("link")).to_have_count(0)  # no MP4 before it is done

        queued = row(page, jobs[58]["id"])
        expect(queued.locator("td").nth(1)).to_have_text("image")
        expect(queued.locator("td").nth(2)).to_have_text("—")
        expect(queued.locator("[data-position]")).to_contain_text("#2 · starts in ~1 min")

        failed = row(page, jobs[57]["id"])
        expect(failed.locator(".badge")).to_have_text("failed")
        expect(failed.locator(".error")).to_have_text("the voice is missing")
        expect(failed.locator("td").nth(1)).to_have_text("speech")
        expect(failed.get_by_role("button")).to_have_count(0)

        # the page's dark look: the panel and a failed badge in the dark palette
        assert page.evaluate("getComputedStyle(document.querySelector('#jobs'))"
                             ".backgroundColor") == "rgb(23, 27, 34)"
        assert failed.locator(".badge").evaluate("b => getComputedStyle(b).color") == \
            "rgb(248, 81, 73)"
        keep_screenshot(page.locator("#jobs"), tmp_path, "dashboard-jobs-dark.png")
    finally:
        context.close()


def test_a_user_key_sees_its_own_jobs(browser, tmp_path_factory, demo_gguf):
    admin = {"authorization": "Bearer jobs-admin"}
    srv = ServerProcess(tmp_path_factory.mktemp("dashboard-jobs-keys"),
                        {**GPU, "admin_api_key": "jobs-admin"}, [smol(demo_gguf)],
                        headers=admin)
    srv.start()
    try:
        with srv.client() as client:
            secrets = {name: client.post("/api/v1/keys", json={"name": name}).json()["key"]
                       for name in ("alice", "bob")}
        given = {}
        for name, secret in secrets.items():
            headers = {"authorization": f"Bearer {secret}"}
            given[name] = submit(srv, "/v1/chat/completions", SHORT_CHAT, headers)
            wait_status(srv, given[name], "succeeded", headers=headers)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_init_script(
            f"sessionStorage.setItem('model-boss-admin-key', {secrets['bob']!r})")
        try:
            page = context.new_page()
            open_jobs(page, srv)
            # the admin panels ask for the admin key; the Jobs panel reads with bob's
            expect(page.locator("#key-dialog")).to_be_visible()
            expect(row(page, given["bob"]).locator(".badge")).to_have_text("succeeded")
            assert shown_ids(page) == [given["bob"]]
            expect(page.locator("#jobs-summary")).to_have_text("1 job: 1 succeeded")

            # a finished video's MP4 with a key: fetched with the key (a link cannot carry
            # it) and saved under the video's name
            clip = {**job(srv, given["bob"], {"authorization": f"Bearer {secrets['bob']}"}),
                    "id": "job-" + "c" * 20, "endpoint": "/v1/videos", "model": "tiny-wan"}
            asked = []

            def content(route):
                asked.append(route.request.headers.get("authorization"))
                route.fulfill(body=b"not really an mp4", content_type="video/mp4")

            page.route("**/api/v1/jobs", lambda route: route.fulfill(json={"jobs": [clip]}))
            page.route(f"**/v1/videos/video_{clip['id']}/content", content)
            link = row(page, clip["id"]).get_by_role("link", name="MP4")
            expect(link).to_have_count(1, timeout=SEEN_MS)
            with page.expect_download() as saved:  # under the admin key's modal dialog
                link.dispatch_event("click")
            assert saved.value.suggested_filename == f"video_{clip['id']}.mp4"
            assert asked == [f"Bearer {secrets['bob']}"]
        finally:
            context.close()
    finally:
        srv.stop()
