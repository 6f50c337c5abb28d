"""A speech request's ``input`` as a script: who says what, in order.

Plain text is one speaker's. A script names its speakers at the start of each line, as
VibeVoice's own examples write them::

    Speaker 1: Welcome back to the show.
    Speaker 2: Thanks for having me.

Speakers are numbered from 1 (or from 0) without gaps, at most :data:`MOST_SPEAKERS`; once one
line names a speaker every non-empty line must. Speaker ``n`` (counted from the first number)
speaks in the ``n``-th voice of the request's ``voices``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SPEAKER_LINE = re.compile(r"^\s*speaker\s*(\d+)\s*:(.*)$", re.IGNORECASE)
MOST_SPEAKERS = 4  # VibeVoice reads at most four voices in one script


class ScriptError(ValueError):
    """Why ``input`` is no script this model reads (the message names the line)."""


@dataclass(frozen=True, slots=True)
class Turn:
    speaker: int  # 0-based: the index of the speaker's voice
    text: str


@dataclass(frozen=True, slots=True)
class Script:
    turns: tuple[Turn, ...]
    speakers: int


def parse_script(text: str) -> Script:
    """``text`` as turns; one speaker's when no line names a speaker. Raises ScriptError."""
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ScriptError("there is nothing to say")
    named = [(n, SPEAKER_LINE.match(line)) for n, line in lines]
    if not any(match for _, match in named):
        return Script((Turn(0, " ".join(line for _, line in lines)),), 1)
    turns: list[tuple[int, str]] = []
    for (n, match), (_, line) in zip(named, lines, strict=True):
        if match is None:
            raise ScriptError(f"line {n} names no speaker (write 'Speaker 1: ...'): "
                              f"{line[:40]!r}")
        said = match.group(2).strip()
        if not said:
            raise ScriptError(f"line {n}: Speaker {match.group(1)} says nothing")
        turns.append((int(match.group(1)), said))
    numbers = sorted({number for number, _ in turns})
    first = numbers[0]
    if first not in (0, 1) or numbers != list(range(first, first + len(numbers))):
        raise ScriptError("speakers are numbered from 1 without gaps; this script has "
                          + ", ".join(str(n) for n in numbers))
    if len(numbers) > MOST_SPEAKERS:
        raise ScriptError(f"at most {MOST_SPEAKERS} speakers; this script has {len(numbers)}")
    return Script(tuple(Turn(number - first, said) for number, said in turns), len(numbers))
