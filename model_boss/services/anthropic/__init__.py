"""Anthropic's Messages API: its bodies (:mod:`.schemas`), its translation to and from chat
completions (:mod:`.translate`, :mod:`.stream`), how an answer is told (:mod:`.answers`),
streams that open at once (:mod:`.opening`), system turns (:mod:`.system_turns`), error
wordings (:mod:`.wording`) and its serving (:mod:`.service`)."""

from .schemas import CountTokensRequest, MessagesRequest
from .service import COUNT_TOKENS, MESSAGES, messages
from .stream import error_body

__all__ = ["COUNT_TOKENS", "MESSAGES", "CountTokensRequest", "MessagesRequest", "error_body",
           "messages"]
