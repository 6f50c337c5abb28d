"""The worker processes the coordinator runs: each one's life (:class:`WorkerProcess`), its
process group (groups.py) and the templates Python workers are forked from (templates.py)."""

from .groups import group_members, kill_group, reap_orphans
from .templates import ForkedProcess, WorkerTemplates
from .worker import WorkerProcess, exit_words, free_port

__all__ = ["ForkedProcess", "WorkerProcess", "WorkerTemplates", "exit_words", "free_port",
           "group_members", "kill_group", "reap_orphans"]
