"""A realtime session's conversation: its items in order, as the chat model reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .events import Item, new_id


@dataclass(slots=True)
class Message:
    """One item of the conversation: who said it and what (a transcript for audio)."""

    id: str
    role: str
    text: str

    def item(self, status: str = "completed") -> dict[str, Any]:
        """The item as server events carry it."""
        kind = "output_audio" if self.role == "assistant" else "input_audio"
        return {"id": self.id, "object": "realtime.item", "type": "message",
                "status": status, "role": self.role,
                "content": [{"type": kind, "transcript": self.text}]}


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

    def truncate(self, item_id: str, heard_ratio: float) -> bool:
        """Cut an assistant item to the part the user heard; False when there is no such
        item."""
        for message in self.items:
            if message.id == item_id:
                words = message.text.split()
                message.text = " ".join(words[: round(len(words) * heard_ratio)])
                return True
        return False

    def messages(self, instructions: str | None) -> list[dict[str, str]]:
        system = [{"role": "system", "content": instructions}] if instructions else []
        return system + [{"role": m.role, "content": m.text} for m in self.items if m.text]
