"""What the daemon keeps of its work: the request log, the usage ledger, captured prompts,
the dashboard's timeline and finished jobs."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RecordSettings(BaseModel):
    """Logs, ledgers and results kept, and for how long."""

    request_log: bool = True
    # every finished request's usage in state_dir/usage.sqlite3 (GET /api/v1/usage); off:
    # kept in memory only, for quotas and reports until the daemon stops
    usage_ledger: bool = True
    # prompt text in the last requests' rows (/api/v1/requests, admin): off unless turned on,
    # and cut to this many characters
    capture_prompts: bool = False
    capture_prompt_chars: int = Field(default=500, ge=1, le=20000)
    history_step_s: float = Field(default=5.0, ge=1, le=600)  # dashboard timeline step
    job_result_ttl_s: float = Field(default=3600.0, gt=0)
    max_jobs: int = Field(default=1000, ge=1)
