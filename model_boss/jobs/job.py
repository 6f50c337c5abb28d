"""Job: one piece of long work (an image, speech, any served endpoint) and its status."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)


class JobStatus(StrEnum):
    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}


@dataclass(slots=True)
class Job:
    id: str
    endpoint: str
    body: dict[str, Any]
    client_id: str
    status: JobStatus = JobStatus.QUEUED
    model: str | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    member: str | None = None  # in a cluster: the member running (or that ran) it
    yields: int = 0  # times it gave its slot back to more important work and waited again
    # the submit's trace context (traceparent, tracestate) where traces are on: its run,
    # on whichever member takes it, is linked to it
    trace: dict[str, str] = field(default_factory=dict)

    def public(self, with_body: bool = False) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        if not with_body:
            data.pop("body")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """A stored record; a field this version does not know (written by a newer member, in
        a cluster upgraded one member at a time) is left out, and said once per field."""
        known = {name: value for name, value in data.items() if name in _FIELDS}
        for name in data.keys() - known.keys() - _said_unknown:
            _said_unknown.add(name)
            log.warning("jobs: a job record carries %r, a field this version does not know "
                        "(written by a newer member): ignored", name)
        known["status"] = JobStatus(known["status"])
        return cls(**known)


_FIELDS = frozenset(f.name for f in fields(Job))
_said_unknown: set[str] = set()  # the unknown fields said in the log already
