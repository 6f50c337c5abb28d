"""A realtime session's conversation: its items in order, as the chat model reads them, and
for the assistant's answers which words went out as audio, and how long each sentence's
audio lasted (so a truncation at a point of the audio cuts the text there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .events import EventError, Item, new_id


@dataclass(slots=True)
class Message:
    """One item of the conversation: who said it and what (a transcript for audio).
    ``said``: for each sentence voiced, where its audio ends (ms from the answer's start)
    and where its text ends (characters of ``text``)."""

    id: str
    role: str
    text: str
    said: list[tuple[float, int]] = field(default_factory=list)

    def item(self, status: str = "completed") -> dict[str, Any]:
        """The item as server events carry it."""
        kind = "output_audio" if self.role == "assistant" else "input_audio"
        return {"id": self.id, "object": "realtime.item", "type": "message",
                "status": status, "role": self.role,
                "content": [{"type": kind, "transcript": self.text}]}

    @property
    def audio_ms(self) -> float:
        """How long the audio sent for it lasts."""
        return self.said[-1][0] if self.said else 0.0

    def voiced(self, sentence: str, audio_ms: float) -> None:
        """``sentence`` (the next of ``text``) went out as ``audio_ms`` of audio."""
        start = self.said[-1][1] if self.said else 0
        found = self.text.find(sentence, start)
        end = found + len(sentence) if found >= 0 else len(self.text)
        self.said.append((self.audio_ms + audio_ms, end))

    def keep_said(self) -> None:
        """Keep only the words that went out as audio (an answer cut off)."""
        self.text = self.text[:self.said[-1][1]].strip() if self.said else ""

    def heard(self, audio_end_ms: float) -> str:
        """Its text up to ``audio_end_ms`` of its audio: the sentences played whole, and of
        the one playing then, its words in proportion to the part played."""
        start_ms, start = 0.0, 0
        for end_ms, end in self.said:
            if audio_end_ms >= end_ms:
                start_ms, start = end_ms, end
                continue
            words = self.text[start:end].split()
            played = round(len(words) * (audio_end_ms - start_ms) / (end_ms - start_ms))
            return " ".join([self.text[:start].strip(), *words[:played]]).strip()
        return self.text[:start].strip() if self.said else self.text


@dataclass(slots=True)
class Conversation:
    """The session's items; :meth:`messages` is the chat request's ``messages``."""

    items: list[Message] = field(default_factory=list)

    def add(self, role: str, text: str, item_id: str | None = None) -> Message:
        message = Message(item_id or new_id("item"), role, text)
        self.items.append(message)
        return message

    def add_item(self, item: Item) -> Message:
        """A ``conversation.item.create``'s message: its text parts (or transcripts) joined."""
        text = " ".join(part.text or part.transcript or "" for part in item.content).strip()
        return self.add(item.role, text, item.id)

    def truncate(self, item_id: str, audio_end_ms: int) -> Message:
        """Cut an assistant item to the part of its audio the user heard (a
        ``conversation.item.truncate``)."""
        message = next((m for m in self.items if m.id == item_id), None)
        if message is None:
            raise EventError(f"item_id: no item '{item_id}'", "item_not_found", "item_id")
        if message.role != "assistant":
            raise EventError(f"item_id: '{item_id}' is not an assistant item with audio",
                             "invalid_value", "item_id")
        if audio_end_ms > message.audio_ms + 1:
            raise EventError(f"audio_end_ms: {audio_end_ms} is past the item's audio "
                             f"({message.audio_ms:.0f} ms)", "invalid_value", "audio_end_ms")
        message.text = message.heard(audio_end_ms)
        return message

    def messages(self, instructions: str | None) -> list[dict[str, str]]:
        system = [{"role": "system", "content": instructions}] if instructions else []
        return system + [{"role": m.role, "content": m.text} for m in self.items if m.text]
