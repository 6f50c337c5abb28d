"""The playground's talk tab in headless Chromium (Debian's package, driven by Playwright) with a
fake microphone playing a recorded question (espeak-ng), against a real coordinator with keys
serving a realtime pipeline: silero-vad, a tiny Whisper, the demo LLM and a tiny VITS voice.
The page's key rides in the socket's subprotocols; a wrong one is refused."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import wave

import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.e2e.chromium import playwright_and_chromium
from tests.lazy_modules import lazy
from tests.realtime_fixtures import build_lettered_whisper, needs_espeak, silence, spoken
from tests.transformers_fixtures import build_voice, shared

pytestmark = [pytest.mark.slow, needs_espeak,
              pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None
                                 or importlib.util.find_spec("transformers") is None,
                                 reason="the 'realtime' and 'transformers' extras")]

sync_api, CHROMIUM = playwright_and_chromium()
websockets = lazy("websockets")

expect = sync_api.expect
KEY = "k-talk"
KEY_STORE = "model-boss-admin-key"
TURN_MS = 200_000  # three cold loads and a turn on a busy 2-core machine
RATE = 24000


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    manifests = [
        {"id": "whisper", "backend": "transformers", "category": "stt",
         "path": str(shared(tmp_path_factory, "whisper-letters", build_lettered_whisper)),
         "vram_mb": 500},
        {"id": "voice", "backend": "transformers", "category": "tts",
         "path": str(shared(tmp_path_factory, "voice", build_voice)), "vram_mb": 500},
        llama_manifest("smol", demo_gguf, vram_mb=500, args=["--temp", "0"]),
        {"id": "talk", "category": "realtime",
         "pipeline": {"transcriber": "whisper", "llm": "smol", "voice": "voice"}},
    ]
    srv = ServerProcess(tmp_path_factory.mktemp("talk"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 4000}],
                         "api_keys": {"talker": KEY}},
                        manifests, headers={"authorization": f"Bearer {KEY}"})
    srv.start()
    yield srv
    srv.stop()


def recording(folder, pcm: bytes):
    """A WAV file for the fake microphone."""
    path = folder / "microphone.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm)
    return path


@pytest.fixture(scope="module")
def playwright():
    with sync_api.sync_playwright() as running:
        yield running


def microphone_browser(playwright, wav, *, loop: bool = False):
    """Chromium whose microphone plays ``wav`` once (then silence) or over and over, granted
    to every page."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}{'' if loop else '%noloop'}",
        "--autoplay-policy=no-user-gesture-required"])


@pytest.fixture(scope="module")
def browser(playwright, tmp_path_factory):
    """The microphone asks one question between silences."""
    wav = recording(tmp_path_factory.mktemp("question"),
                    silence(1.0) + spoken("What is the capital of France?") + silence(8.0))
    chromium = microphone_browser(playwright, wav)
    yield chromium
    chromium.close()


def talk_page(browser, server):
    context = browser.new_context()
    context.add_init_script(f"sessionStorage.setItem('{KEY_STORE}', '{KEY}')")
    page = context.new_page()
    assert page.goto(server.url + "/ui/").ok
    expect(page.locator("#pg-model option[value='talk']")).to_have_count(1)
    page.select_option("#pg-model", "talk")
    expect(page.locator("#pg-mode")).to_have_value("talk")  # from the pipeline's category
    expect(page.locator("#pg-send")).to_have_text("Start talking")
    return context, page


async def open_socket(server, key: str) -> str | int:
    """The subprotocol the server chose for a socket offering ``key``, or the status of its
    refusal."""
    url = server.url.replace("http", "ws") + "/v1/realtime?model=talk"
    try:
        async with websockets.connect(url, origin=server.url, subprotocols=[
                "realtime", f"openai-insecure-api-key.{key}"]) as socket:
            created = json.loads(await asyncio.wait_for(socket.recv(), 120))
            assert created["type"] == "session.created"
            return socket.subprotocol
    except websockets.exceptions.InvalidStatus as refused:
        return refused.response.status_code


def test_the_socket_takes_the_key_from_its_subprotocols(server):
    assert asyncio.run(open_socket(server, "wrong")) == 401
    assert asyncio.run(open_socket(server, KEY)) == "realtime"  # never the key


def test_a_spoken_question_is_heard_answered_and_played(browser, server):
    context, page = talk_page(browser, server)
    try:
        page.fill("#pg-talk-max-tokens", "24")
        page.click("#pg-send")
        expect(page.locator("#pg-stop")).to_have_text("Stop talking")
        heard = page.locator("#pg-talk-log .pg-heard[data-status='done'] .words")
        expect(heard).to_have_count(1, timeout=TURN_MS)
        answer = page.locator("#pg-talk-log .pg-answer[data-status='completed'] .words")
        expect(answer).to_have_count(1, timeout=TURN_MS)
        expect(answer).not_to_have_text("")
        expect(heard).to_have_text(re.compile(r"^[A-Za-z ]+$"))  # what the Whisper wrote
        # the answer's voice was played through WebAudio, all of what came
        log = page.locator("#pg-talk-log")
        expect(log).to_have_attribute("data-played-samples", re.compile(r"^[1-9]\d*$"),
                                      timeout=TURN_MS)
        expect(log).to_have_attribute("data-played-samples",
                                      log.get_attribute("data-queued-samples"))
        expect(page.locator("#pg-meta [data-fact='Turns']")).to_have_text("1")
        expect(page.locator("#pg-error")).to_be_hidden()
        # the page's own session, under the queue while it is open (the status read again)
        session = page.locator("#session-table tbody tr[data-session]")
        expect(session.locator("td")).to_have_text(
            [re.compile("."), "talk", "talker", re.compile(r"^\d+$"), re.compile("s$"), "1"],
            timeout=30_000)
        page.click("#pg-stop")
        expect(page.locator("#pg-status")).to_contain_text("Stopped after")
        expect(page.locator("#playground")).to_have_attribute("data-state", "done")
        expect(session).to_have_count(0, timeout=30_000)

        # a wrong key (swapped in as the click is made: the page's other reads would ask
        # for a good one): the socket is refused, and the page says why in the key's words
        page.evaluate(f"""() => {{
          sessionStorage.setItem('{KEY_STORE}', 'wrong');
          document.getElementById('pg-send').click();
        }}""")
        expect(page.locator("#pg-error")).to_contain_text("refused", timeout=30_000)
        expect(page.locator("#pg-error")).to_contain_text("invalid API key")
        expect(page.locator("#pg-talk-log li")).to_have_count(0)
        expect(page.locator("#playground")).to_have_attribute("data-state", "error")
    finally:
        context.close()


def test_speech_over_the_answer_cuts_it_where_it_was_heard(playwright, server, tmp_path):
    """Barge-in: the microphone asks its question again and again, 3 s apart, and the answers
    run longer than that (up to 200 tokens): once the models are warm, a question comes while
    an answer plays. The page stops the playback there and tells the server how much of the
    answer was heard, which the server takes; that answer's later audio is never played."""
    wav = recording(tmp_path, silence(0.5) + spoken("What is the capital of France?")
                    + silence(3.0))
    chromium = microphone_browser(playwright, wav, loop=True)
    context, page = talk_page(chromium, server)
    try:
        page.fill("#pg-talk-max-tokens", "200")
        page.click("#pg-send")
        cut = page.locator("#pg-talk-log .pg-answer[data-status='cut']").first
        expect(cut).to_have_attribute("data-heard-ms", re.compile(r"^[1-9]\d*$"),
                                      timeout=TURN_MS)
        # the server took the cut where the page said it was
        expect(cut).to_have_attribute("data-truncated-ms", cut.get_attribute("data-heard-ms"))
        log = page.locator("#pg-talk-log")
        played, queued = (int(log.get_attribute(f"data-{name}-samples"))
                          for name in ("played", "queued"))
        assert 0 < played < queued
        # and the question that cut in is heard
        expect(page.locator("#pg-talk-log .pg-answer[data-status='cut'] ~ "
                            ".pg-heard[data-status='done']").first).to_be_visible(
            timeout=TURN_MS)
        page.click("#pg-stop")
        expect(page.locator("#pg-status")).to_contain_text("Stopped after")
    finally:
        context.close()
        chromium.close()


def status_with(sessions: list[dict] | None):
    """A route handler answering ``/api/v1/status`` as the server does, with its
    ``realtime_sessions`` replaced by ``sessions`` (None: without the field)."""
    def answer(route):
        response = route.fetch()
        body = response.json()
        body.pop("realtime_sessions", None)
        if sessions is not None:
            body["realtime_sessions"] = [
                {**{k: v for k, v in s.items() if k != "open_s"},
                 "opened_at": body["time"] - s["open_s"]} for s in sessions]
        route.fulfill(response=response, json=body)
    return answer


@pytest.mark.parametrize("sessions", [None, [], [
    {"id": "sess_a", "model": "talk", "key": "talker", "priority": 10, "open_s": 75,
     "turns": 3}]])
def test_open_realtime_sessions_are_listed_where_the_status_has_them(browser, server,
                                                                     sessions):
    context = browser.new_context()
    context.add_init_script(f"sessionStorage.setItem('{KEY_STORE}', '{KEY}')")
    page = context.new_page()
    try:
        page.route("**/api/v1/status", status_with(sessions))
        assert page.goto(server.url + "/ui/").ok
        expect(page.locator("#queue-summary")).to_contain_text("waiting")  # drawn
        box = page.locator("#sessions-box")
        if sessions is None:
            expect(box).to_be_hidden()
            return
        expect(box).to_be_visible()
        rows = page.locator("#session-table tbody tr")
        if not sessions:
            expect(rows).to_have_text(["No open sessions."])
            return
        cells = rows.locator("td")
        expect(cells).to_have_text(["sess_a", "talk", "talker", "10",
                                    re.compile(r"^1 min 1\d s$"), "3"])
    finally:  # a status read still being answered is let go with the page
        context.unroute_all(behavior="ignoreErrors")
        page.unroute_all(behavior="ignoreErrors")
        context.close()
