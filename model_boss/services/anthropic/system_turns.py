"""System turns inside ``messages`` (Claude Code sends them mid-conversation to models it
does not know), placed as the model's chat template allows.

Leading ones join the top-level ``system`` (every template takes a first system prompt).
Later ones go to the worker as system turns: llama.cpp's ``/v1/messages`` takes them, a
template with a system role renders them as such and llama.cpp folds them into the next user
turn for one without. A template that refuses them (Gemma's and Mistral's raise "roles must
alternate") answers 400: that model is remembered (:class:`SystemTurnMemory`) and the request
is served again with each folded into the next user turn as a delimited block
(:func:`folded`).
"""

from __future__ import annotations

from typing import Any

from ...errors import ModelBossError

# the block a folded system turn becomes, at the head of the next user turn
FOLD_OPEN = "<system>\n"
FOLD_CLOSE = "\n</system>"
# what template and API refusals of a system turn say (llama.cpp's jinja exceptions, vLLM's,
# Anthropic's own without the beta)
_REFUSALS = ("must alternate", "system role", "system message", "role 'system'",
             'role "system"', "unexpected role")
_REMEMBERED_MAX = 512  # models, far more than a catalog holds


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _text(blocks: list[dict[str, Any]]) -> str:
    return "\n\n".join(block.get("text", "") for block in blocks)


def lift_leading(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the system turns that open ``messages`` joined to its top-level
    ``system`` (a copy when there are any)."""
    messages = body.get("messages") or []
    count = next((i for i, m in enumerate(messages) if m.get("role") != "system"),
                 len(messages))
    if count == 0:
        return body
    system = [dict(block) for block in _blocks(body.get("system") or [])]
    for message in messages[:count]:
        for block in _blocks(message["content"]):
            if system and block.get("text"):  # llama.cpp joins blocks without a break
                block = {**block, "text": "\n\n" + block["text"]}
            system.append(dict(block))
    return {**body, "system": system, "messages": list(messages[count:])}


def has_system_turns(body: dict[str, Any]) -> bool:
    return any(message.get("role") == "system" for message in body.get("messages") or [])


def folded(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with every system turn folded into the next user turn (else the last one
    before it; else the top-level ``system``) as a ``<system>`` block; turns of one role left
    side by side are then joined, as a template that wants them alternating needs."""
    body = lift_leading(body)
    if not has_system_turns(body):
        return body
    kept: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # folded blocks waiting for the next user turn
    for message in body["messages"]:
        if message["role"] == "system":
            pending.append(_fold_block(message))
            continue
        if message["role"] == "user" and pending:
            message = {**message, "content": [*pending, *_blocks(message["content"])]}
            pending = []
        kept.append(message)
    if pending:
        last = next((i for i in range(len(kept) - 1, -1, -1) if kept[i]["role"] == "user"),
                    None)
        if last is not None:
            kept[last] = {**kept[last], "content": [*_blocks(kept[last]["content"]), *pending]}
        else:
            body = lift_leading({**body, "messages": [
                {"role": "system", "content": [_unwrapped(b) for b in pending]}]})
    return {**body, "messages": _joined(kept)}


def _fold_block(message: dict[str, Any]) -> dict[str, Any]:
    blocks = _blocks(message["content"])
    block: dict[str, Any] = {"type": "text", "text": FOLD_OPEN + _text(blocks) + FOLD_CLOSE}
    marked = next((b["cache_control"] for b in reversed(blocks) if b.get("cache_control")),
                  None)
    if marked is not None:
        block["cache_control"] = marked
    return block


def _unwrapped(block: dict[str, Any]) -> dict[str, Any]:
    text = block["text"].removeprefix(FOLD_OPEN).removesuffix(FOLD_CLOSE)
    return {**block, "text": text}


def _joined(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            out[-1] = {**out[-1], "content": [*_blocks(out[-1]["content"]),
                                              *_blocks(message["content"])]}
        else:
            out.append(message)
    return out


def refuses_system_turns(exc: BaseException) -> bool:
    """Whether a worker's error says its template (or API) refused a system turn."""
    if not isinstance(exc, ModelBossError) or not 400 <= exc.status_code < 500:
        return False
    message = exc.message.lower()
    return any(words in message for words in _REFUSALS)


class SystemTurnMemory:
    """The models whose templates refused a system turn: their requests are folded from the
    start. Learned per process; a model is forgotten only when the memory is full."""

    def __init__(self, limit: int = _REMEMBERED_MAX) -> None:
        self.limit = limit
        self._refusing: dict[str, None] = {}  # insertion-ordered: the oldest goes first

    def refuses(self, model_id: str) -> bool:
        return model_id in self._refusing

    def learn(self, model_id: str) -> None:
        self._refusing.pop(model_id, None)
        self._refusing[model_id] = None
        while len(self._refusing) > self.limit:
            self._refusing.pop(next(iter(self._refusing)))
