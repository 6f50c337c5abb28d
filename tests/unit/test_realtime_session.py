"""The session's turn loop with its three calls replaced (the seam is services/realtime/calls):
the answer is spoken a sentence at a time, before it is finished, and a response.cancel ends
it as cancelled."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from model_boss.catalog.manifest import PipelineSpec
from model_boss.services.extensions import Extensions
from model_boss.services.realtime import RealtimeSession, calls

PIPELINE = PipelineSpec(transcriber="ears", llm="brain", voice="mouth")


@pytest.fixture
def said(monkeypatch):
    spoken: list[str] = []
    release = asyncio.Event()

    async def chat_deltas(coord, model, messages, ext, usage, max_tokens=None):
        for delta in ["Paris is ", "the capital. ", "It is "]:
            yield delta
        await release.wait()  # the rest comes only when the test says
        yield "lovely."
        usage.update(prompt_tokens=5, completion_tokens=4)

    async def speak(coord, model, text, voice, rate, ext):
        spoken.append(text)
        return b"\1\0" * 480

    monkeypatch.setattr(calls, "chat_deltas", chat_deltas)
    monkeypatch.setattr(calls, "speak", speak)
    return spoken, release


class Events(list):
    """The events emitted, and a wake-up for each."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Condition()


async def _session():
    events = Events()

    async def emit(event):
        async with events.changed:
            events.append(event)
            events.changed.notify_all()

    session = RealtimeSession(None, "talk", PIPELINE, Extensions(), emit)
    session.detection = None  # no turn detector: typed turns only
    return session, events


async def _until(events, kind):
    async with asyncio.timeout(5), events.changed:
        await events.changed.wait_for(lambda: any(e["type"] == kind for e in events))


async def test_each_sentence_is_spoken_before_the_answer_ends(said):
    spoken, release = said
    session, events = await _session()
    await session.handle(orjson.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "?"}]}}))
    await session.handle(b'{"type": "response.create"}')
    await _until(events, "response.output_audio.delta")
    assert spoken == ["Paris is the capital."]  # spoken while the answer is still coming
    release.set()
    await _until(events, "response.done")
    assert spoken == ["Paris is the capital.", "It is lovely."]
    done = events[-1]["response"]
    assert (done["status"], done["usage"]["output_tokens"]) == ("completed", 4)
    assert done["output"][0]["content"][0]["transcript"] == "Paris is the capital. It is lovely."
    assert [m.role for m in session.conversation.items] == ["user", "assistant"]


async def test_response_cancel_ends_the_answer_as_cancelled(said):
    session, events = await _session()
    await session.handle(b'{"type": "response.create"}')
    await _until(events, "response.output_audio.delta")
    await session.handle(b'{"type": "response.cancel"}')
    done = events[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "cancelled"
    assert session.response is None


async def test_a_second_response_while_one_runs_is_an_error_event(said):
    session, events = await _session()
    await session.handle(b'{"type": "response.create"}')
    await session.handle(b'{"type": "response.create", "event_id": "again"}')
    error = next(e for e in events if e["type"] == "error")["error"]
    assert (error["code"], error["event_id"]) == ("conversation_already_has_active_response",
                                                 "again")
    await session.close()
