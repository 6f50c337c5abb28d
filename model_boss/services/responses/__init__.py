"""OpenAI's Responses API (``POST /v1/responses``) as coding agents read it: llama.cpp's
server answers it, and what its stream leaves out of OpenAI's spec is put in on the way back
(sequence numbers, output and content indexes, the closing events, reasoning items, ids and
usage), with ``prompt_cache_key`` keeping a session on one of its slots."""

from .affinity import SlotAffinity
from .dialect import DIALECT, RESPONSES, ResponsesDialect, told
from .events import ResponsesStream, encoded
from .whole import normalized_response

__all__ = [
    "DIALECT",
    "RESPONSES",
    "ResponsesDialect",
    "ResponsesStream",
    "SlotAffinity",
    "encoded",
    "normalized_response",
    "told",
]
