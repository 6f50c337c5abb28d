"""A worker's error answer in model-boss's envelope: what the request got wrong stays a 4xx
the client can act on; what the worker got wrong is a 502."""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..errors import UpstreamError

_ENVELOPE_FIELDS = {"message", "type", "code", "param"}
# llama.cpp's advice names its own flags ("Start it with `--embeddings`"), which model-boss
# sets: the advice a user can follow names the manifest field instead
_START_WITH = re.compile(r"[Ss]tart it with\s+`?(--[\w-]+)`?")
_FLAG_NEEDED = re.compile(r"(?:requires|try using|use it with)\s+`?(--[\w-]+)`?(?:\s+flag)?"
                          r"(?:\s+instead)?")
_FIELDS = {"message", "type", "code", "param"}
# llama.cpp's advice names its own flags ("Start it with `--embeddings`"), which model-boss
# sets: the advice a user can follow names the manifest field instead
_FLAG_ADVICE = re.compile(r"(?:[Ss]tart it with|requires|try using|use it with)\s+`?(--[\w-]+)`?"
                          r"(?:\s+flag)?(?:\s+instead)?")
_FIELDS = {"--embeddings": "set `embeddings: true` in the model's manifest",
           "--reranking": "set `reranking: true` in the model's manifest",
           "--mmproj": "give the model a vision projector (`mmproj:` in its manifest, or an "
                       "mmproj*.gguf beside a discovered file)",
           "--jinja": "give the model a chat template that supports it (`chat_template:` in "
                      "its manifest)"}
_CODES = {"exceed_context_size_error": "context_length_exceeded"}
# types that say "the server failed": a 4xx keeps OpenAI's client type instead
_NOT_CLIENT_TYPES = {"server_error", "api_error", "internal_error", "unavailable_error"}


def _remedy(flag: str) -> str:
    return _FIELDS.get(flag, "the model needs a worker flag model-boss does not set for it "
                             "(its manifest's `args`)")


def upstream_error(model_id: str, status: int, raw: bytes, *,
                   our_secret: bool = True) -> UpstreamError:
    """Map a worker's error answer into our envelope. What the request got wrong keeps a 4xx
    the client can act on: the worker's own 4xx, a 501 (the model cannot do this), and a 5xx
    whose message says the request was wrong (llama.cpp answers some of those 500). The
    worker refusing model-boss's key (401/403) and every other 5xx are the server's failure:
    502. A cloud remote (``our_secret=False``: the key is the operator's, not a per-worker
    secret) keeps its 401/403. ``serve()`` redacts the message (no traceback, path or
    address)."""
    message, code, param = raw.decode(errors="replace")[:500], None, None
    kind: str | None = None
    details: dict[str, Any] = {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        message = str(err.get("message") or message)
        code = err.get("code") if isinstance(err.get("code"), str) else None
        param = err.get("param") if isinstance(err.get("param"), str) else None
        kind = err.get("type") if isinstance(err.get("type"), str) else None
        # numbers the worker adds (llama.cpp: n_prompt_tokens and n_ctx of a prompt too long)
        details = {k: v for k, v in err.items() if k not in _ENVELOPE_FIELDS
                   and isinstance(v, int | float) and not isinstance(v, bool)}
    elif isinstance(err, str):
        message = err
    elif isinstance(data, dict) and data.get("detail"):
        message = str(data["detail"])
    message = _START_WITH.sub(lambda m: f"To turn this on, {_remedy(m.group(1))}",
                              message[:1000])
    message = _FLAG_NEEDED.sub(lambda m: f"(to fix it, {_remedy(m.group(1))})", message)
    if status in (401, 403) and our_secret:
        return UpstreamError(f"worker for '{model_id}' refused the coordinator's credentials "
                             f"({status})")
    # 5xx messages of llama.cpp's server that are about the request, not the worker
    request_faults = ("failed to parse", "not supported", "unsupported", "expected '",
                      "must be", "json schema")
    lowered = message.lower()
    if status == 501 or (status >= 500 and any(h in lowered for h in request_faults)):
        status, code = 400, code or ("unsupported_request" if status == 501 else None)
    if 400 <= status < 500:
        error = UpstreamError(f"{model_id}: {message}", status_code=status, param=param,
                              code=code or _CODES.get(kind or "", "invalid_request"))
        # the worker's own type where it names one (llama.cpp's exceed_context_size_error)
        error.error_type = "rate_limit_error" if status == 429 else (
            kind if kind and kind not in _NOT_CLIENT_TYPES else "invalid_request_error")
        error.details = details
        return error
    return UpstreamError(f"worker for '{model_id}' answered {status}: {message}")
