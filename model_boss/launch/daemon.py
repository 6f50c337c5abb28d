"""What ``model-boss launch`` asks the daemon: which model to point the agent at and how
much context a request on it gets. ``/v1/models`` names the models (any key may read it,
within its scope); ``/api/show`` gives a model's context per request (``num_ctx``: the
manifest's ``ctx_size`` over its parallel slots) and what its GGUF was trained for."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import network_reason

CHAT_CATEGORIES = ("llm", "vision")
_NUM_CTX = re.compile(r"\bnum_ctx\s+(\d+)")


class LaunchError(Exception):
    """Why an agent cannot be launched: a one-line message and the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class ServedModel:
    """A chat model as the daemon serves it."""

    id: str
    context: int  # tokens one request may hold
    trained: int | None  # the GGUF's own context length, where known
    source: str  # manifest | discovered | pulled


def served_model(client: httpx.Client, wanted: str | None) -> ServedModel:
    """The model ``wanted`` (an id or an alias; ``None``: the daemon's only chat model) and
    its context. ``client`` has the daemon's base URL and the key; errors become
    :class:`LaunchError`."""
    entries = [entry for entry in _get(client, "GET", "/v1/models").get("data", [])
               if entry.get("category", "llm") in CHAT_CATEGORIES]
    entry = _choose(entries, wanted, str(client.base_url))
    if entry.get("available") is False:
        reason = entry.get("unavailable_reason") or "unavailable"
        raise LaunchError(f"'{entry['id']}' cannot be served now: {reason}", 2)
    context, trained = _context(client, entry)
    return ServedModel(entry["id"], context, trained, str(entry.get("source") or "manifest"))


def _choose(entries: list[dict[str, Any]], wanted: str | None, url: str) -> dict[str, Any]:
    names = ", ".join(entry["id"] for entry in entries) or "none"
    if wanted is None:
        if len(entries) == 1:
            return entries[0]
        raise LaunchError(f"which model? pass --model; the chat models at {url}: {names}", 2)
    for entry in entries:
        if wanted == entry["id"] or wanted in (entry.get("aliases") or []):
            return entry
    raise LaunchError(f"no chat model '{wanted}' at {url}; its chat models: {names}", 2)


def _context(client: httpx.Client, entry: dict[str, Any]) -> tuple[int, int | None]:
    """``(per request, trained)``: a ``context_length`` in the models list where the daemon
    gives one, else ``/api/show``'s."""
    shown = _get(client, "POST", "/api/show", {"model": entry["id"]})
    trained = next((int(value) for name, value in (shown.get("model_info") or {}).items()
                    if name.endswith(".context_length") and value), None)
    listed = entry.get("context_length")
    if isinstance(listed, int) and listed > 0:
        return listed, trained
    found = _NUM_CTX.search(str(shown.get("parameters", "")))
    if found is None:
        raise LaunchError(f"the daemon does not say how much context '{entry['id']}' has", 1)
    return int(found.group(1)), trained


def _get(client: httpx.Client, method: str, path: str,
         body: dict[str, Any] | None = None) -> dict[str, Any]:
    url = str(client.base_url).rstrip("/")
    try:
        response = client.request(method, path, json=body)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # worded as every command words it
        raise LaunchError(f"cannot reach {url}: {network_reason(exc)}") from exc
    if response.status_code in (401, 403):
        raise LaunchError(f"{url} refused the key ({response.status_code}): set "
                          "MODEL_BOSS_API_KEY or pass --key")
    if response.status_code >= 400:
        raise LaunchError(f"{url}{path} answered {response.status_code}: "
                          f"{_message(response)}")
    try:
        data = response.json()
    except ValueError as exc:
        raise LaunchError(f"{url}{path} answered something other than JSON") from exc
    if not isinstance(data, dict):
        raise LaunchError(f"{url}{path} answered something other than a JSON object")
    return data


def _message(response: httpx.Response) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    return " ".join(str(message).split())[:300] or "no message"
