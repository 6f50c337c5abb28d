"""A realtime answer's words against its audio, table-driven: a truncation at a point of the
audio keeps the sentences played whole and, of the one playing, its words in proportion; an
answer cut off keeps what was voiced; and a key's minute as ``rate_limits.updated`` lists it."""

from __future__ import annotations

import pytest

from model_boss.services.realtime.conversation import Conversation
from model_boss.services.realtime.events import EventError
from model_boss.settings import ClientProfile
from model_boss.tenancy.keys import MinuteReading, minute_left

ANSWER = "Paris is the capital. It is a lovely city of light."


def answer() -> Conversation:
    """An answer of two sentences: the first 1000 ms of audio, the second 2000 ms."""
    conversation = Conversation()
    conversation.add("user", "What is the capital of France?", "u1")
    message = conversation.add("assistant", ANSWER, "a1")
    message.voiced("Paris is the capital.", 1000)
    message.voiced("It is a lovely city of light.", 2000)
    return conversation


@pytest.mark.parametrize("case, audio_end_ms, heard", [
    ("nothing played", 0, ""),
    ("half the first sentence", 500, "Paris is"),
    ("the first sentence whole", 1000, "Paris is the capital."),
    ("a quarter into the second (7 words: 2 played)", 1500, "Paris is the capital. It is"),
    ("all of it", 3000, ANSWER),
])
def test_truncate_keeps_what_was_played(case, audio_end_ms, heard):
    conversation = answer()
    assert conversation.truncate("a1", audio_end_ms).text == heard, case
    assert conversation.messages(None)[-1]["content"] == heard or not heard


@pytest.mark.parametrize("case, item_id, audio_end_ms, param", [
    ("no such item", "nope", 0, "item_id"),
    ("a user item has no audio to cut", "u1", 0, "item_id"),
    ("past the end of its audio", "a1", 3500, "audio_end_ms"),
])
def test_a_truncate_that_cannot_be_is_an_error_naming_the_field(case, item_id, audio_end_ms,
                                                                param):
    with pytest.raises(EventError) as refused:
        answer().truncate(item_id, audio_end_ms)
    assert refused.value.param == param, case


def test_an_answer_cut_off_keeps_only_what_was_voiced():
    conversation = Conversation()
    message = conversation.add("assistant", "Paris is the capital. It is")
    message.voiced("Paris is the capital.", 1000)
    message.keep_said()
    assert message.text == "Paris is the capital."
    silent = conversation.add("assistant", "Nothing voiced yet")
    silent.keep_said()
    assert silent.text == ""


@pytest.mark.parametrize("case, profile, reading, left", [
    ("no rates: nothing to say", ClientProfile(), MinuteReading(), []),
    ("requests: two used, the oldest 20 s ago", ClientProfile(requests_per_minute=5),
     MinuteReading(request_times=(980.0, 990.0)),
     [{"name": "requests", "limit": 5, "remaining": 3, "reset_seconds": 40.0}]),
    ("tokens over the limit: none left", ClientProfile(tokens_per_minute=100),
     MinuteReading(token_events=((950.0, 80), (999.0, 40))),
     [{"name": "tokens", "limit": 100, "remaining": 0, "reset_seconds": 10.0}]),
    ("an empty minute resets now", ClientProfile(requests_per_minute=1), MinuteReading(),
     [{"name": "requests", "limit": 1, "remaining": 1, "reset_seconds": 0.0}]),
])
def test_minute_left(case, profile, reading, left):
    assert minute_left(profile, reading, 1000.0) == left, case
