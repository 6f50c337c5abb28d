"""What a replica probably holds in its prompt cache: the request's prompt, rendered as plain
text in message order, cut into fixed blocks and hashed in a chain (block ``i``'s hash covers
every block before it, so one hash stands for a whole prefix), and per replica a bounded LRU
set of the hashes it was sent. Approximate by design: no tokenizer, no template; a match of
``n`` blocks means the first ``n * BLOCK_CHARS`` characters were sent there before."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ...slot_key import SlotKey

BLOCK_CHARS = 256  # some 64 tokens of English
CHARS_PER_TOKEN = 4  # what ``cached_prefix_tokens`` divides by (an estimate, not a count)


def _text(content: Any) -> str:
    """A message's content as text: a string, or its parts' texts (an image part: its URL
    or data, so two pictures differ)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                found = part.get("text") or part.get("image_url") or part.get("source") or ""
                out.append(found if isinstance(found, str) else repr(found))
            elif isinstance(part, str):
                out.append(part)
        return "\n".join(out)
    return "" if content is None else repr(content)


def rendered(body: dict[str, Any]) -> str:
    """The prompt as the model reads it, near enough: system first, then each message's role
    and text (chat, Anthropic's messages, the Responses API's input), or a completion's
    prompt."""
    parts: list[str] = []
    if body.get("system") is not None:  # Anthropic's
        parts.append("system\n" + _text(body["system"]))
    if body.get("instructions"):  # the Responses API's
        parts.append("system\n" + _text(body["instructions"]))
    messages = body.get("messages")
    if messages is None and isinstance(body.get("input"), list):
        messages = body["input"]
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                parts.append(f"{message.get('role', '')}\n{_text(message.get('content'))}")
    for key in ("prompt", "input"):
        if not parts and isinstance(body.get(key), str):
            parts.append(body[key])
    return "\n\n".join(parts)


def prompt_blocks(body: dict[str, Any], block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The chained hashes of the rendered prompt's whole blocks (a last partial block is
    left out: the next turn will have changed it)."""
    text = rendered(body).encode("utf-8", "surrogatepass")
    chain, hashes = b"", []
    for start in range(0, len(text) - block_chars + 1, block_chars):
        chain = hashlib.blake2b(chain + text[start:start + block_chars], digest_size=8).digest()
        hashes.append(int.from_bytes(chain, "big"))
    return tuple(hashes)


def session_of(body: dict[str, Any], header: str | None) -> str | None:
    """What keeps a conversation together: ``X-Session-Id``, else Anthropic's
    ``metadata.user_id``, else OpenAI's ``user``."""
    metadata = body.get("metadata")
    for found in (header, metadata.get("user_id") if isinstance(metadata, dict) else None,
                  body.get("user")):
        if isinstance(found, str) and found:
            return found[:200]
    return None


class PrefixIndex:
    """Per replica, the block hashes it was sent, least recently used out first."""

    def __init__(self, max_blocks: int = 8192) -> None:
        self.max_blocks = max_blocks
        self._held: dict[SlotKey, OrderedDict[int, None]] = {}

    def record(self, replica: SlotKey, blocks: Iterable[int]) -> None:
        held = self._held.setdefault(replica, OrderedDict())
        for block in blocks:
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.max_blocks:
            held.popitem(last=False)

    def matched(self, replica: SlotKey, blocks: tuple[int, ...]) -> int:
        """How many leading blocks of ``blocks`` ``replica`` was sent (the longest held
        prefix: each hash stands for every block before it)."""
        held = self._held.get(replica)
        if not held:
            return 0
        for n in range(len(blocks), 0, -1):
            if blocks[n - 1] in held:
                return n
        return 0

    def forget(self, replica: SlotKey) -> None:
        """The replica's worker went (stopped, crashed): its cache with it."""
        self._held.pop(replica, None)

    def summary(self, replica: SlotKey, limit: int = 512) -> list[int]:
        """The most recently sent hashes (what a cluster member publishes)."""
        held = self._held.get(replica) or {}
        return list(held)[-limit:]

    def sizes(self) -> dict[SlotKey, int]:
        return {replica: len(held) for replica, held in self._held.items()}


class Sessions:
    """Session key → the replica its conversation was last served on (bounded LRU)."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._where: OrderedDict[str, SlotKey] = OrderedDict()

    def get(self, session: str | None) -> SlotKey | None:
        return self._where.get(session) if session else None

    def served(self, session: str | None, replica: SlotKey) -> None:
        if not session:
            return
        self._where[session] = replica
        self._where.move_to_end(session)
        while len(self._where) > self.limit:
            self._where.popitem(last=False)

    def forget(self, replica: SlotKey) -> None:
        for session in [s for s, r in self._where.items() if r == replica]:
            del self._where[session]
