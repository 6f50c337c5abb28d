"""The transformers worker's cancel by request id, without a model: the ticket book (a cancel
before its request, after it, or for every open one) and the batcher (a cancelled embedding or
rerank request still queued leaves the queue and never runs)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import httpx
import orjson
import pytest

from tests.lazy_modules import lazy
from workers.transformers.app import create_app
from workers.transformers.batcher import Batcher
from workers.transformers.cancel import Cancelled, Tickets
from workers.transformers.engine import Engine
from workers.transformers.errors import WorkerError
from workers.transformers.options import WorkerOptions

np = lazy("numpy")


def test_a_cancel_reaches_an_open_ticket_and_is_counted_once_closed():
    book = Tickets()
    ticket = book.open("a")
    assert book.running() == ["a"] and not ticket.cancelled
    assert book.cancel("a")["outcome"] == "cancelling"
    with pytest.raises(Cancelled):
        ticket.check()
    book.close(ticket, stopped=True)
    assert (book.running(), book.cancelled, book.last_cancelled) == ([], 1, "a")
    assert book.cancel("a")["outcome"] == "finished"  # over: nothing to do


def test_a_cancel_that_overtakes_its_request_refuses_it_and_only_it():
    book = Tickets()
    assert book.cancel("early")["outcome"] == "remembered"
    assert book.open("early").cancelled
    assert not book.open("other").cancelled
    assert not book.open(None).cancelled  # a fresh id


def test_no_id_cancels_every_open_request_and_a_duplicate_id_is_refused():
    book = Tickets()
    one, two = book.open("1"), book.open("2")
    assert sorted(book.cancel(None)["cancelled"]) == ["1", "2"]
    assert one.cancelled and two.cancelled
    with pytest.raises(WorkerError) as refused:
        book.open("1")
    assert (refused.value.status, refused.value.code) == (409, "duplicate_request_id")


async def test_a_queued_request_cancelled_leaves_the_batcher_without_running():
    ran: list[list[str]] = []
    release = threading.Event()

    def run(items: list[str]) -> list[str]:
        if not ran:
            release.wait(5)  # the first batch runs until the test lets it go
        ran.append(list(items))
        return [item.upper() for item in items]

    batcher = Batcher(run, batch_size=4, max_wait_s=0.0)
    batcher.start()
    book = Tickets()
    try:
        first = asyncio.create_task(batcher.submit(["a"], book.open("first")))
        await asyncio.sleep(0.1)  # running, holding the model
        doomed_ticket = book.open("doomed")
        doomed = asyncio.create_task(batcher.submit(["b", "c"], doomed_ticket))
        kept = asyncio.create_task(batcher.submit(["d"], book.open("kept")))
        await asyncio.sleep(0.05)
        book.cancel("doomed")
        with pytest.raises(Cancelled):
            await doomed
        release.set()
        assert await first == ["A"] and await kept == ["D"]
    finally:
        release.set()
        await batcher.stop()
    assert ran == [["a"], ["d"]]  # the cancelled request's items never reached the model


async def test_a_request_cancelled_while_its_batch_runs_gets_cancelled_not_its_results():
    release = threading.Event()

    def run(items: list[str]) -> list[str]:
        release.wait(5)
        return items

    batcher = Batcher(run, batch_size=4, max_wait_s=0.0)
    batcher.start()
    try:
        ticket = Tickets().open("x")
        task = asyncio.create_task(batcher.submit(["a"], ticket))
        await asyncio.sleep(0.1)
        ticket.cancel()
        release.set()
        with pytest.raises(Cancelled):
            await task
    finally:
        release.set()
        await batcher.stop()


class _Voice(Engine):
    """A speaking engine without a model: each sentence is 0.1 s of silence."""

    speakers = 1
    sets_speed = False

    def __init__(self) -> None:
        super().__init__(WorkerOptions(model="voice", task="tts", port=0))
        self.state, self.rate = "ready", 16000

    def synthesize(self, text: str, *, speed: float = 1.0, speaker: int | None = None,
                   ticket: Any = None) -> Any:
        if ticket is not None:
            ticket.check()
        return np.zeros(1600, dtype=np.float32)


async def _speak(app: Any, spec: str, send: Any, receive: Any) -> None:
    """One ``POST /v1/audio/speech`` (two sentences, streamed as pcm) straight into the ASGI
    app, as a server speaking ASGI ``spec`` would."""
    body = orjson.dumps({"input": "One sentence. And another.", "response_format": "pcm",
                         "request_id": "talk"})
    given = False

    async def first_then(message_after: Any) -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await message_after()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/v1/audio/speech",
             "raw_path": b"/v1/audio/speech", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    await app(scope, lambda: first_then(receive), send)


@pytest.mark.parametrize("spec", ["2.4", "2.3"])
async def test_a_speech_stream_whose_client_left_before_it_began_closes_its_ticket(spec):
    """The client gone before the answer's first byte: the stream never starts (an unstarted
    generator has no ``finally`` to run), yet its ticket is closed, not left running."""
    app = create_app(_Voice())

    async def gone() -> Any:
        return {"type": "http.disconnect"}

    async def refused(message: Any) -> None:
        raise OSError("the client is gone")

    with contextlib.suppress(Exception):  # (no lifespan: speech needs no batcher)
        await _speak(app, spec, refused, gone)
    await asyncio.sleep(0.1)  # a generator closed by its finalizer gets its turn
    assert await _health(app) == ([], 1)  # and counted as stopped short


async def test_a_speech_stream_read_to_its_end_closes_its_ticket_uncancelled():
    app = create_app(_Voice())
    sent: list[Any] = []

    async def keep(message: Any) -> None:
        sent.append(message)

    async def waits() -> Any:
        await asyncio.sleep(3600)

    await _speak(app, "2.4", keep, waits)
    audio = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert sent[0]["status"] == 200 and len(audio) == 2 * 1600 * 2  # two sentences, 16-bit
    assert await _health(app) == ([], 0)


async def _health(app: Any) -> tuple[list[str], int]:
    """The worker's open requests and how many a cancel (or a client gone) stopped."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        health = (await client.get("/health")).json()
    return health["running"], health["cancelled"]


def test_decoding_a_long_upload_stops_at_the_next_frame_once_cancelled():
    """Decoding half an hour of audio is seconds of work: a cancel that comes while it runs
    stops it at the next frame, not after the whole file (and its stop time is recorded)."""
    import io

    import av

    from workers.transformers.audio import decode

    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as file:
        stream = file.add_stream("flac", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000 * 60), dtype=np.int16),
                                           format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            file.mux(packet)
    book = Tickets()
    ticket = book.open("long")
    frames = 0

    def check() -> None:
        nonlocal frames
        frames += 1
        if frames == 3:
            book.cancel("long")
        ticket.check()

    with pytest.raises(Cancelled):
        decode(out.getvalue(), 16000, check)
    assert frames == 3  # of some 230 frames in a minute of FLAC
    book.close(ticket, stopped=True)
    assert book.last_stop_ms is not None and book.last_stop_ms >= 0
    assert decode(out.getvalue(), 16000).size == 16000 * 60  # no check: the whole file
