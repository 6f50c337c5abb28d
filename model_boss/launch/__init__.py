"""``model-boss launch``: coding agents (Claude Code, Codex, aider, opencode) started with
what they need to use this daemon. The agents and their settings are pure functions
(:mod:`.agents`), the context check too (:mod:`.fit`); :mod:`.daemon` asks the daemon and
``model_boss.cli.launch`` carries the launch out."""

from .agents import AGENTS, Agent
from .daemon import LaunchError, ServedModel, served_model
from .fit import ANSWER_ROOM, find_manifest, needed_context, refusal
from .plan import Launch, Target, mask

__all__ = ["AGENTS", "ANSWER_ROOM", "Agent", "Launch", "LaunchError", "ServedModel", "Target",
           "find_manifest", "mask", "needed_context", "refusal", "served_model"]
