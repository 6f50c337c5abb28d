"""The speech script parser (workers/transformers/script.py): who says what, and the scripts
refused with the line that is wrong."""

from __future__ import annotations

import pytest

from workers.transformers.script import ScriptError, Turn, parse_script


@pytest.mark.parametrize(("text", "speakers", "turns"), [
    ("Hello there.", 1, [(0, "Hello there.")]),
    ("Hello\nthere.", 1, [(0, "Hello there.")]),  # plain lines are one speaker's text
    ("Speaker 1: Hi.", 1, [(0, "Hi.")]),
    ("Speaker 1: Hi.\nSpeaker 2: Hello.\nSpeaker 1: Bye.", 2,
     [(0, "Hi."), (1, "Hello."), (0, "Bye.")]),
    ("Speaker 0: Hi.\nSpeaker 1: Hello.", 2, [(0, "Hi."), (1, "Hello.")]),  # from 0
    ("  speaker 2 : Hello.\n\nSPEAKER 1:Hi.", 2, [(1, "Hello."), (0, "Hi.")]),
    ("Speaker 1: A: B", 1, [(0, "A: B")]),
    ("Speaker 1: a\nSpeaker 2: b\nSpeaker 3: c\nSpeaker 4: d", 4,
     [(0, "a"), (1, "b"), (2, "c"), (3, "d")]),
])
def test_scripts_are_read_into_turns(text, speakers, turns):
    script = parse_script(text)
    assert script.speakers == speakers
    assert list(script.turns) == [Turn(s, t) for s, t in turns]


@pytest.mark.parametrize(("text", "says"), [
    ("", "nothing to say"),
    ("  \n \n", "nothing to say"),
    ("Speaker 1: Hi.\nno speaker", "line 2 names no speaker"),
    ("Speaker 1: Hi.\nSpeaker 2:   ", "line 2: Speaker 2 says nothing"),
    ("Speaker 1: a\nSpeaker 3: b", "without gaps; this script has 1, 3"),
    ("Speaker 2: a\nSpeaker 3: b", "without gaps; this script has 2, 3"),
    ("\n".join(f"Speaker {n}: x" for n in range(1, 6)), "at most 4 speakers"),
])
def test_bad_scripts_say_what_is_wrong(text, says):
    with pytest.raises(ScriptError, match=says):
        parse_script(text)
