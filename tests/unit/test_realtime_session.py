"""The session's turn loop with its three calls replaced (the seam is services/realtime/calls):
the answer is spoken a sentence at a time, before it is finished, a response.cancel (or speech
heard while it runs) ends it as cancelled, and each response asks the key's rates."""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest

from model_boss.catalog.manifest import PipelineSpec
from model_boss.errors import RateLimited
from model_boss.services.extensions import Extensions
from model_boss.services.realtime import RealtimeSession, SpeechStarted, calls
from model_boss.services.realtime.events import TurnDetection

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


class HearsSpeech:
    """A turn detector that hears speech start in the next audio appended."""

    def hear(self, pcm):
        return [SpeechStarted(audio_start_ms=0)]

    def reset(self):
        pass


async def test_speech_heard_while_an_answer_runs_cancels_it_keeping_only_what_was_voiced(said):
    session, events = await _session()
    session.detection = TurnDetection()
    session.turns = HearsSpeech()
    await session.handle(b'{"type": "response.create"}')
    await _until(events, "response.output_audio.delta")  # "Paris is the capital." voiced
    await session.handle(orjson.dumps({"type": "input_audio_buffer.append",
                                       "audio": base64.b64encode(b"\0\0" * 480).decode()}))
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["input_audio_buffer.speech_started", "response.done"], kinds
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    # "It is " was written but never voiced: the conversation keeps what the user heard
    assert done["output"][0]["content"][0]["transcript"] == "Paris is the capital."
    assert session.conversation.items[-1].text == "Paris is the capital."


async def test_barge_in_can_be_turned_off(said):
    session, events = await _session()
    session.detection = TurnDetection(interrupt_response=False)
    session.turns = HearsSpeech()
    await session.handle(b'{"type": "response.create"}')
    await _until(events, "response.output_audio.delta")
    await session.handle(orjson.dumps({"type": "input_audio_buffer.append",
                                       "audio": base64.b64encode(b"\0\0" * 480).decode()}))
    assert session.responding
    await session.close()


class Gate:
    def __init__(self, refused=None):
        self.refused, self.asked = refused, 0

    def admit(self):
        self.asked += 1
        return self.refused

    def rate_limits(self):
        return [{"name": "requests", "limit": 10, "remaining": 10 - self.asked,
                 "reset_seconds": 60.0}]


async def test_each_response_asks_the_key_and_says_what_is_left(said):
    spoken, release = said
    release.set()
    session, events = await _session()
    session.gate = gate = Gate()
    await session.handle(b'{"type": "response.create"}')
    await _until(events, "rate_limits.updated")
    kinds = [e["type"] for e in events]
    assert kinds.index("response.done") < kinds.index("rate_limits.updated")
    assert events[-1]["rate_limits"][0]["remaining"] == 9 and gate.asked == 1


async def test_a_response_over_the_keys_rate_is_an_error_event_and_never_starts(said):
    session, events = await _session()
    session.gate = Gate(RateLimited("key 'k' is over its rate of 1 requests per minute",
                                    retry_after_s=30))
    await session.handle(b'{"type": "response.create", "event_id": "e1"}')
    error = events[-1]["error"]
    assert (error["code"], error["event_id"]) == ("rate_limited", "e1")
    assert session.response is None and session.responses == 0
