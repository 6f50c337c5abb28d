"""Errors in Anthropic's own words where clients key on them. A prompt longer than the
model's context is Anthropic's 400 ``prompt is too long: N tokens > M maximum`` (Claude Code
compacts its conversation on those words), followed by what sets the maximum here: the
manifest's ``ctx_size`` shared by its ``parallel`` slots."""

from __future__ import annotations

import re
from collections.abc import Callable

from ...catalog import BackendKind, ModelManifest
from ...errors import ModelBossError

PROMPT_TOO_LONG = "prompt is too long: {prompt} tokens > {maximum} maximum"
_CONTEXT_CODES = {"context_length_exceeded", "exceed_context_size_error"}
_CONTEXT_WORDS = ("context size", "context length", "context window")
# the numbers in the words of llama.cpp ("request (3031 tokens) exceeds the available context
# size (1024 tokens)") and of OpenAI-compatible servers ("maximum context length is 8192
# tokens. However, you requested 9000 tokens (8990 in the messages, ...)")
_LLAMA = re.compile(r"\((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")
_MAXIMUM = re.compile(r"maximum context length is (\d+)")
_PROMPTS = (re.compile(r"(\d+) (?:tokens )?in the messages"),
            re.compile(r"resulted in (\d+) tokens"), re.compile(r"requested (\d+) tokens"))

ManifestOf = Callable[[str], ModelManifest | None]


def is_context_overflow(exc: ModelBossError) -> bool:
    """Whether a worker refused a prompt longer than its context."""
    if not 400 <= exc.status_code < 500:
        return False
    return exc.code in _CONTEXT_CODES or exc.error_type in _CONTEXT_CODES \
        or {"n_prompt_tokens", "n_ctx"} <= exc.details.keys() \
        or any(words in exc.message.lower() for words in _CONTEXT_WORDS)


def _sizes(exc: ModelBossError) -> tuple[int, int] | None:
    details = exc.details
    if isinstance(details.get("n_prompt_tokens"), int) and isinstance(details.get("n_ctx"), int):
        return details["n_prompt_tokens"], details["n_ctx"]
    found = _LLAMA.search(exc.message)
    if found:
        return int(found.group(1)), int(found.group(2))
    maximum = _MAXIMUM.search(exc.message)
    prompt = next((m for m in (p.search(exc.message) for p in _PROMPTS) if m), None)
    if maximum and prompt:
        return int(prompt.group(1)), int(maximum.group(1))
    return None


def where_the_maximum_is_set(model_id: str, manifest: ModelManifest | None) -> str:
    if manifest is None or manifest.backend != BackendKind.LLAMA_SERVER:
        return f"the context of '{model_id}'"
    slots = manifest.concurrency
    shared = f" shared by {slots} parallel slots" if slots > 1 else ""
    return (f"'{model_id}' has the context its manifest's `ctx_size: {manifest.ctx_size}` "
            f"gives it{shared}; raise `ctx_size` for longer prompts")


def in_anthropic_words(exc: BaseException, model_id: str | None,
                       manifest_of: ManifestOf) -> BaseException:
    """``exc``, its message in Anthropic's words where a client reads them (changed in
    place: its status, type and headers stay)."""
    if not isinstance(exc, ModelBossError) or not is_context_overflow(exc):
        return exc
    if exc.message.startswith("prompt is too long"):
        return exc  # already told (a member's answer, a retried request)
    sizes = _sizes(exc)
    named = model_id or exc.message.split(":", 1)[0]
    where = where_the_maximum_is_set(named, manifest_of(named))
    if sizes is None:
        exc.message = f"prompt is too long: {exc.message} ({where})"
    else:
        exc.message = PROMPT_TOO_LONG.format(prompt=sizes[0], maximum=sizes[1]) \
            + f" ({where})"
    exc.args = (exc.message,)
    return exc
