"""Jobs: submit long work, poll it, cancel it. Stored in Redis (with a TTL) or embedded."""

from .job import FINISHED, Job, JobStatus
from .manager import JobManager, Runner
from .runner import JobRunner, Work
from .stores import EmbeddedJobStore, JobStore, RedisJobStore

__all__ = [
    "FINISHED",
    "EmbeddedJobStore",
    "Job",
    "JobManager",
    "JobRunner",
    "JobStatus",
    "JobStore",
    "RedisJobStore",
    "Runner",
    "Work",
]
