"""``system_fingerprint``: the llama.cpp build that answered, where its server cannot say.

llama.cpp's server puts its ``build_info`` in every OpenAI-shaped answer. A build made
without its git metadata (the ``xllamacpp`` wheel's, a ``llama-server`` built from a source
archive) says ``b0-unknown``, which tells a client nothing and reads like a bug. Those answers
are given the build the worker kind knows instead (``xllamacpp-VERSION`` for the wheel, which
pins the llama.cpp it was built from), or ``null`` where none is known. Rewritten in the
answer's bytes as they pass, a stream's too (a chunk cut inside the field is held back until
the rest of it comes); a real build's fingerprint passes untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

UNKNOWN = b'"system_fingerprint":"b0-unknown"'


def replacement(build: str | None) -> bytes:
    """The field that stands for ``UNKNOWN``: the build, or null."""
    return b'"system_fingerprint":' + orjson.dumps(build)


def rewrite(body: bytes, build: str | None) -> bytes:
    """A whole answer with its unknown fingerprint replaced."""
    return body.replace(UNKNOWN, replacement(build)) if UNKNOWN in body else body


def _held_back(data: bytes) -> int:
    """How many bytes at the end of ``data`` may be the start of ``UNKNOWN``."""
    quote = data.find(b'"', max(0, len(data) - len(UNKNOWN) + 1))
    while quote != -1:  # the earliest start that fits: the longest part that may be it
        if UNKNOWN.startswith(data[quote:]):
            return len(data) - quote
        quote = data.find(b'"', quote + 1)
    return 0


async def rewrite_stream(chunks: AsyncIterator[bytes], build: str | None
                         ) -> AsyncIterator[bytes]:
    """``chunks`` with every unknown fingerprint replaced, however the field was cut."""
    field = replacement(build)
    carry = b""
    try:
        async for chunk in chunks:
            data = carry + chunk if carry else chunk
            if UNKNOWN in data:
                data = data.replace(UNKNOWN, field)
            keep = _held_back(data)
            carry = data[len(data) - keep:] if keep else b""
            if keep < len(data):
                yield data[:len(data) - keep]
        if carry:
            yield carry
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
