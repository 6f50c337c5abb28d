"""Client events of the Realtime API: what is taken, and what is refused and how it is named."""

from __future__ import annotations

import orjson
import pytest

from model_boss.services.realtime import EventError, parse_client_event
from model_boss.services.realtime.events import (
    AudioAppend,
    ItemCreate,
    ResponseCancel,
    SessionUpdate,
    error_event,
)


def _raw(**event) -> bytes:
    return orjson.dumps(event)


@pytest.mark.parametrize(("event", "kind"), [
    ({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
      "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                          "turn_detection": {"type": "server_vad",
                                             "silence_duration_ms": 400}},
                "output": {"voice": "alloy"}}, "tools": []}}, SessionUpdate),
    ({"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "e1"}, AudioAppend),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
      "content": [{"type": "input_text", "text": "hi"}]}}, ItemCreate),
    ({"type": "response.cancel"}, ResponseCancel),
])
def test_a_well_formed_event_is_parsed_to_its_type(event, kind):
    assert isinstance(parse_client_event(_raw(**event)), kind)


def test_turn_detection_null_turns_it_off():
    parsed = parse_client_event(_raw(type="session.update", session={
        "type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    assert parsed.session.audio.input.turn_detection is None
    assert "turn_detection" in parsed.session.audio.input.model_fields_set


@pytest.mark.parametrize(("raw", "code", "param", "words"), [
    (b"{not json", "invalid_json", None, "not valid JSON"),
    (b"[1, 2]", "invalid_event", None, "a JSON object"),
    (_raw(audio="AAAA"), "missing_field", "type", "type: required"),
    (_raw(type="input_audio_buffer.shout", event_id="e9"), "unknown_event", "type",
     "unknown event type 'input_audio_buffer.shout'"),
    (_raw(type="input_audio_buffer.append"), "invalid_value", "audio", "audio: Field required"),
    (_raw(type="input_audio_buffer.append", audio="AAAA", loud=True), "invalid_value",
     "loud", "loud"),
    (_raw(type="session.update", session={"audio": {"input": {"format": {
        "type": "audio/pcm", "rate": 16000}}}}), "invalid_value",
     "session.audio.input.format.rate", "24000"),
    (_raw(type="session.update", session={"audio": {"input": {"turn_detection": {
        "type": "semantic_vad"}}}}), "invalid_value", "session.audio.input.turn_detection.type",
     "server_vad"),
    (_raw(type="conversation.item.truncate", item_id="i", content_index=0,
          audio_end_ms=-1), "invalid_value", "audio_end_ms", "greater than or equal"),
])
def test_a_malformed_or_unknown_event_is_named(raw, code, param, words):
    with pytest.raises(EventError) as caught:
        parse_client_event(raw)
    assert (caught.value.code, caught.value.param) == (code, param)
    assert words in str(caught.value)


def test_an_error_event_carries_the_client_events_id():
    with pytest.raises(EventError) as caught:
        parse_client_event(_raw(type="nope", event_id="client-7"))
    exc = caught.value
    event = error_event(str(exc), exc.code, exc.param, exc.event_id)
    assert event["type"] == "error"
    assert event["error"]["event_id"] == "client-7"
    assert event["error"]["code"] == "unknown_event"
