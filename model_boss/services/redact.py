"""What a client may read of a failure: a worker's words, without its traceback, the files it
runs from or the addresses it listens on (the coordinator's log keeps the whole story)."""

from __future__ import annotations

import re

from ..errors import ModelBossError

_TRACEBACK = re.compile(r"Traceback \(most recent call last\):.*", re.DOTALL)
_PY_FRAME = re.compile(r'File "[^"]*", line \d+(?:, in \S+)?')
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]{}]+", re.IGNORECASE)
_HOST_PORT = re.compile(r"\b(?:localhost|\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]):\d{2,5}\b",
                        re.IGNORECASE)
# a file path: absolute, home-relative or dot-relative, two components at least; API routes
# (/v1/..., /api/...) and JSON pointers (#/properties/a) are not files
_PATH = re.compile(r"(?<![\w.#/:-])(?:~|\.{1,2})?/(?!v1/|api/)(?:[\w.@+=,-]+/)+([\w.@+=,-]+)")


def redact(message: str) -> str:
    """``message`` with tracebacks cut, URLs and host:port pairs replaced, and file paths
    shortened to their last component."""
    text = _TRACEBACK.sub("", message)
    text = _PY_FRAME.sub("", text)
    text = _URL.sub("<internal address>", text)
    text = _HOST_PORT.sub("<internal address>", text)
    text = _PATH.sub(lambda match: match.group(1), text)
    text = text.strip().rstrip(":;|,-").strip()
    return text or "the worker failed (details are in the coordinator's log)"


def redacted(exc: ModelBossError) -> ModelBossError:
    """``exc`` with its message redacted (in place: its status, code and headers stay)."""
    exc.message = redact(exc.message)
    exc.args = (exc.message,)
    return exc
