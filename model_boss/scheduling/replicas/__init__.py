"""Replicas: where a model runs more than once, which copy a request goes to (its prompt's
cached prefix, its session, the copies' load) and when one more copy is worth starting."""

from .choice import ReplicaView, Route, ScaleView, route, scale_up
from .prefixes import BLOCK_CHARS, PrefixIndex, Sessions, prompt_blocks, session_of
from .router import ReplicaRouter, cached_prefix_tokens

__all__ = ["BLOCK_CHARS", "PrefixIndex", "ReplicaRouter", "ReplicaView", "Route", "ScaleView",
           "Sessions", "cached_prefix_tokens", "prompt_blocks", "route", "scale_up",
           "session_of"]
