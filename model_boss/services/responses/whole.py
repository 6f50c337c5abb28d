"""A Responses API ``response`` object as OpenAI's spec has it, whatever llama.cpp left out:
an id ``resp_…``, every output item with its id and status, the message parts with their
``annotations`` and ``logprobs``, usage with ``input_tokens_details.cached_tokens`` and
``output_tokens_details.reasoning_tokens``. The same for a whole answer and for the response
a stream's last event carries."""

from __future__ import annotations

import secrets
import time
from typing import Any

# an output item's id prefix by its type, as OpenAI names them
ITEM_PREFIXES = {"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def response_id(given: Any) -> str:
    """A response's id as OpenAI's look: ``resp_…``."""
    given = str(given or "")
    return given if given.startswith("resp_") else "resp_" + (given or secrets.token_hex(16))


def item_with_id(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` with an id: its own, else its ``call_id`` where that is an item id (older
    llama.cpp servers named a function call's item ``fc_…`` only as its call id), else a
    new one."""
    if item.get("id"):
        return item
    call_id = item.get("call_id")
    if isinstance(call_id, str) and call_id.startswith("fc_"):
        return {**item, "id": call_id}
    return {**item, "id": new_id(ITEM_PREFIXES.get(str(item.get("type")), "item_"))}


def finished_item(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as a finished response lists it."""
    item = item_with_id(item)
    item = {**item, "status": item.get("status") or "completed"}
    if item.get("type") == "message":
        item["content"] = [_part(part) for part in item.get("content") or []]
    elif item.get("type") == "reasoning":
        item.setdefault("summary", [])
    return item


def _part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") == "output_text":
        return {"annotations": [], "logprobs": [], **part}
    return part


def normalized_response(response: dict[str, Any], model_id: str,
                        order: dict[str, int] | None = None,
                        reasoning_tokens: int | None = None) -> dict[str, Any]:
    """``response`` as OpenAI's spec has it (see the module). ``order``: the stream's output
    indexes by item id, which the output list follows; ``reasoning_tokens``: what the stream
    counted (else 0 without a reasoning item; left out when not known)."""
    whole = dict(response)
    whole["id"] = response_id(whole.get("id"))
    whole["object"] = "response"
    whole["model"] = model_id
    whole.setdefault("created_at", int(time.time()))
    whole.setdefault("status", "completed")
    output = [finished_item(item) for item in whole.get("output") or []
              if isinstance(item, dict)]
    if order:
        last = len(order)
        output.sort(key=lambda item: order.get(item["id"], last))
    whole["output"] = output
    usage = whole.get("usage")
    if isinstance(usage, dict):
        usage = dict(usage)
        usage.setdefault("input_tokens_details", {"cached_tokens": 0})
        if reasoning_tokens is None and not any(i.get("type") == "reasoning" for i in output):
            reasoning_tokens = 0
        if reasoning_tokens is not None:
            usage.setdefault("output_tokens_details", {"reasoning_tokens": reasoning_tokens})
        whole["usage"] = usage
    return whole


def opening_response(response: dict[str, Any], model_id: str) -> dict[str, Any]:
    """The response ``response.created`` and ``response.in_progress`` carry: llama.cpp's
    id and status, with what OpenAI's also says there."""
    return {"created_at": int(time.time()), "status": "in_progress", "output": [],
            **response, "id": response_id(response.get("id")), "object": "response",
            "model": model_id}
