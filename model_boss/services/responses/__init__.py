"""OpenAI's Responses API (``POST /v1/responses``) as coding agents read it: llama.cpp's
server answers it, and what its stream leaves out of OpenAI's spec is put in on the way back
(sequence numbers, output and content indexes, the closing events, reasoning items, ids and
usage), with ``prompt_cache_key`` keeping a session on one of its slots."""

from .adapter import ADAPTER, RESPONSES, ResponsesAdapter, told
from .affinity import SlotAffinity
from .events import ResponsesStream, encoded
from .whole import normalized_response

__all__ = [
    "ADAPTER",
    "RESPONSES",
    "ResponsesAdapter",
    "ResponsesStream",
    "SlotAffinity",
    "encoded",
    "normalized_response",
    "told",
]
