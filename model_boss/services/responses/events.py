"""llama.cpp's Responses API stream told as OpenAI's spec tells it.

llama.cpp's server (the xllamacpp build, and llama-server binaries of the same age) streams
the events by name but leaves out what stricter clients read: ``sequence_number`` on every
event, ``output_index`` on item events, ``content_index`` on part and text events; it never
says ``response.reasoning_text.done``, ``response.function_call_arguments.done`` or a
reasoning item's ``content_part`` events, and keeps an item open while the next one starts.
:class:`ResponsesStream` takes its events one by one and gives the events to send: numbered
0, 1, 2, ... per response, each item and part indexed in the order it was added, a missing
closing event sent right before its item's ``response.output_item.done`` (or before the
response's last event, for an item never closed), the opening and closing responses with
what OpenAI's carry (:mod:`.whole`). Events it does not know pass numbered. Items are not
reordered: a client reads them by ``output_index`` and ``item_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from .whole import finished_item, item_with_id, new_id, normalized_response, opening_response

Event = dict[str, Any]
# a part's kind → its delta and done events and the field its text is in
TEXT_EVENTS = {"output_text": ("response.output_text.delta", "response.output_text.done",
                               "text"),
               "reasoning_text": ("response.reasoning_text.delta",
                                  "response.reasoning_text.done", "text"),
               "refusal": ("response.refusal.delta", "response.refusal.done", "refusal")}
DELTAS = {names[0]: kind for kind, names in TEXT_EVENTS.items()}
DONES = {names[1]: kind for kind, names in TEXT_EVENTS.items()}
# the item a part of each kind belongs to, when an event names an item never added
PART_ITEMS = {"output_text": "message", "refusal": "message", "reasoning_text": "reasoning"}
OPENING = ("response.created", "response.in_progress")
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@dataclass(slots=True, eq=False)  # parts are told apart by identity, not by their text
class _Part:
    kind: str
    text: str = ""
    text_done: bool = False  # its ``*.done`` event was sent
    closed: bool = False  # its ``response.content_part.done`` was sent


@dataclass(slots=True)
class _Item:
    id: str
    index: int
    item: dict[str, Any]
    parts: list[_Part] = field(default_factory=list)
    arguments: str = ""
    arguments_done: bool = False
    done: bool = False

    @property
    def kind(self) -> str:
        return str(self.item.get("type"))

    def open_part(self, kind: str | None = None) -> _Part | None:
        part = self.parts[-1] if self.parts else None
        if part is None or part.closed or (kind is not None and part.kind != kind):
            return None
        return part

    def snapshot(self) -> dict[str, Any]:
        """The item as what was streamed of it says it is (for one never closed)."""
        item = {**self.item, "status": "completed"}
        if self.kind == "function_call":
            item["arguments"] = self.arguments
        elif self.parts:
            item["content"] = [part_body(p.kind, p.text) for p in self.parts]
        return item


def part_body(kind: str, text: str) -> dict[str, Any]:
    part: dict[str, Any] = {"type": kind, TEXT_EVENTS.get(kind, ("", "", "text"))[2]: text}
    if kind == "output_text":
        part.update(annotations=[], logprobs=[])
    return part


def _output_part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") == "output_text":
        return {**part, "annotations": part.get("annotations") or [],
                "logprobs": part.get("logprobs") or []}
    return part


class ResponsesStream:
    """One response's events, in and out (see the module)."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.sequence = 0  # the next event's sequence_number
        self.items: dict[str, _Item] = {}
        self.by_call: dict[str, str] = {}  # a function call's call_id → its item id
        self.order: list[_Item] = []
        self.reasoning_deltas = 0  # llama.cpp sends one per token it generates

    def feed(self, event: Event) -> list[Event]:
        """The events to send for one of llama.cpp's, numbered."""
        kind = event.get("type")
        if kind in OPENING:
            out = [{**event, "response": opening_response(event.get("response") or {},
                                                          self.model_id)}]
        elif kind == "response.output_item.added":
            out = self._added(event.get("item") or {})
        elif kind == "response.content_part.added":
            out = self._part_added(event)
        elif kind in DELTAS:
            out = self._text_delta(event, DELTAS[kind])
        elif kind in DONES:
            out = self._text_done(event, DONES[kind])
        elif kind == "response.content_part.done":
            out = self._part_done(event)
        elif kind == "response.function_call_arguments.delta":
            out = self._arguments_delta(event)
        elif kind == "response.function_call_arguments.done":
            out = self._arguments_done(event)
        elif kind == "response.output_item.done":
            out = self._item_done(event.get("item") or {})
        elif kind in TERMINAL:
            out = self._terminal(event)
        else:
            out = [self._indexed(event)]
        return [self._numbered(e) for e in out]

    def _numbered(self, event: Event) -> Event:
        event["sequence_number"] = self.sequence
        self.sequence += 1
        return event

    def _lookup(self, item_id: Any) -> _Item | None:
        if not isinstance(item_id, str):
            return None
        return self.items.get(item_id) or self.items.get(self.by_call.get(item_id, ""))

    def _indexed(self, event: Event) -> Event:
        found = self._lookup(event.get("item_id"))
        return {**event, "output_index": found.index} if found is not None else dict(event)

    # -- items --------------------------------------------------------------------------

    def _added(self, given: dict[str, Any]) -> list[Event]:
        item = item_with_id(dict(given))
        item.setdefault("status", "in_progress")
        found = self._lookup(item["id"])
        if found is None:
            found = _Item(item["id"], len(self.order), item)
            self.items[found.id] = found
            self.order.append(found)
            if isinstance(item.get("call_id"), str):
                self.by_call[item["call_id"]] = found.id
        return [{"type": "response.output_item.added", "output_index": found.index,
                 "item": item}]

    def _item_for(self, event: Event, kind: str) -> tuple[_Item, list[Event]]:
        """The item an event names, added first when it never was."""
        found = self._lookup(event.get("item_id"))
        if found is not None:
            return found, []
        item: dict[str, Any] = {"type": kind, "id": event.get("item_id") or new_id(
            "msg_" if kind == "message" else "rs_")}
        if kind == "message":
            item.update(role="assistant", content=[])
        elif kind == "reasoning":
            item.update(summary=[], content=[])
        out = self._added(item)
        return self.items[item["id"]], out

    def _item_done(self, given: dict[str, Any]) -> list[Event]:
        item = item_with_id(dict(given))
        found = self._lookup(item["id"]) or self._lookup(item.get("call_id"))
        out: list[Event] = []
        if found is None:
            out += self._added({**item, "status": "in_progress"})
            found = self.items[item["id"]]
        if found.done:
            return []  # closed already (before the response's last event)
        item["id"] = found.id
        out += self._close(found, item)
        found.item, found.done = finished_item(item), True
        return [*out, {"type": "response.output_item.done", "output_index": found.index,
                       "item": found.item}]

    def _close(self, found: _Item, final: dict[str, Any]) -> list[Event]:
        """What llama.cpp leaves unsaid before an item is done: its parts' text and part
        done events, a function call's arguments done event."""
        out: list[Event] = []
        content = final.get("content") if isinstance(final.get("content"), list) else []
        for position, part in enumerate(found.parts):
            if part.closed:
                continue
            given = content[position] if position < len(content) else None
            text_field = TEXT_EVENTS.get(part.kind, ("", "", "text"))[2]
            text = given.get(text_field, part.text) if isinstance(given, dict) else part.text
            if not part.text_done:
                out += self._text_done({"item_id": found.id, text_field: text}, part.kind)
            out += self._part_done({"item_id": found.id,
                                    "part": given or part_body(part.kind, text)})
        if found.kind == "function_call" and not found.arguments_done:
            out += self._arguments_done({"item_id": found.id,
                                         "arguments": final.get("arguments", found.arguments)})
        return out

    # -- parts and their text -----------------------------------------------------------

    def _part_added(self, event: Event, kind: str | None = None) -> list[Event]:
        part = event.get("part") if isinstance(event.get("part"), dict) else None
        kind = kind or (part or {}).get("type") or "output_text"
        found, out = self._item_for(event, PART_ITEMS.get(kind, "message"))
        found.parts.append(_Part(kind))
        return [*out, {**event, "type": "response.content_part.added", "item_id": found.id,
                       "output_index": found.index, "content_index": len(found.parts) - 1,
                       "part": _output_part(part or part_body(kind, ""))}]

    def _part_for(self, event: Event, kind: str) -> tuple[_Item, _Part, list[Event]]:
        """The open part of ``kind`` an event is about, added first when none is open."""
        found, out = self._item_for(event, PART_ITEMS.get(kind, "message"))
        part = found.open_part(kind)
        if part is None:
            out += self._part_added({"item_id": found.id}, kind)
            part = found.parts[-1]
        return found, part, out

    def _text_delta(self, event: Event, kind: str) -> list[Event]:
        found, part, out = self._part_for(event, kind)
        part.text += str(event.get("delta") or "")
        if kind == "reasoning_text":
            self.reasoning_deltas += 1
        sent = {**event, "item_id": found.id, "output_index": found.index,
                "content_index": found.parts.index(part)}
        if kind == "output_text":
            sent.setdefault("logprobs", [])
        return [*out, sent]

    def _text_done(self, event: Event, kind: str) -> list[Event]:
        found, part, out = self._part_for(event, kind)
        text_field = TEXT_EVENTS[kind][2]
        part.text_done = True
        sent = {"type": TEXT_EVENTS[kind][1], **event, "item_id": found.id,
                "output_index": found.index, "content_index": found.parts.index(part),
                text_field: event.get(text_field, part.text)}
        if kind == "output_text":
            sent.setdefault("logprobs", [])
        return [*out, sent]

    def _part_done(self, event: Event) -> list[Event]:
        given = event.get("part") if isinstance(event.get("part"), dict) else {}
        found, out = self._item_for(event, "message")
        part = found.open_part(given.get("type"))
        if part is None and not found.parts:  # done without being added: added now
            out += self._part_added({"item_id": found.id, "part": part_body(
                given.get("type") or "output_text", "")})
            part = found.parts[-1]
        index = found.parts.index(part) if part is not None else len(found.parts) - 1
        if part is not None:
            text_field = TEXT_EVENTS.get(part.kind, ("", "", "text"))[2]
            if not part.text_done:
                out += self._text_done({"item_id": found.id,
                                        text_field: given.get(text_field, part.text)},
                                       part.kind)
            part.closed = True
            given = given or part_body(part.kind, part.text)
        return [*out, {**event, "type": "response.content_part.done", "item_id": found.id,
                       "output_index": found.index, "content_index": index,
                       "part": _output_part(given)}]

    # -- function calls -----------------------------------------------------------------

    def _arguments_delta(self, event: Event) -> list[Event]:
        found, out = self._item_for(event, "function_call")
        found.arguments += str(event.get("delta") or "")
        return [*out, {**event, "item_id": found.id, "output_index": found.index}]

    def _arguments_done(self, event: Event) -> list[Event]:
        found, out = self._item_for(event, "function_call")
        found.arguments_done = True
        return [*out, {"type": "response.function_call_arguments.done", **event,
                       "item_id": found.id, "output_index": found.index,
                       "arguments": event.get("arguments", found.arguments),
                       "name": event.get("name") or found.item.get("name")}]

    # -- the end ------------------------------------------------------------------------

    def _terminal(self, event: Event) -> list[Event]:
        response = event.get("response") if isinstance(event.get("response"), dict) else {}
        output = []
        for item in response.get("output") or []:
            if not isinstance(item, dict):
                continue
            found = self._lookup(item.get("id")) or self._lookup(item.get("call_id"))
            output.append({**item, "id": found.id} if found is not None else item)
        finals = {item.get("id"): item for item in output}
        out: list[Event] = []
        for found in self.order:
            if not found.done:
                out += self._item_done(finals.get(found.id) or found.snapshot())
        # the items as their done events told them, then any only the response names
        output = [found.item for found in self.order] + [
            item for item in output if self._lookup(item.get("id")) is None]
        reasoning = any(found.kind == "reasoning" for found in self.order)
        whole = normalized_response(
            {**response, "output": output}, self.model_id,
            order={found.id: found.index for found in self.order},
            reasoning_tokens=self.reasoning_deltas if reasoning else None)
        return [*out, {**event, "response": whole}]


def encoded(event: Event) -> bytes:
    """One event on the wire: its name, then its data."""
    return (b"event: " + str(event.get("type") or "message").encode() + b"\ndata: "
            + orjson.dumps(event) + b"\n\n")
