"""Several coordinators sharing one Redis (docs/CLUSTER.md): the Redis, the secret of their
forwards, each member's name and address, and the clocks of membership, loads and jobs."""

from __future__ import annotations

import socket
from typing import Self

from pydantic import Field, SecretStr, model_validator

from .core import ServerSettings


class ClusterSettings(ServerSettings):
    """The shared Redis and this member of a cluster; its name and address default to the
    daemon's own host and port."""

    redis_url: str = ""
    # several coordinators sharing one Redis (docs/CLUSTER.md): on with ``cluster: true``
    cluster: bool = False
    cluster_secret: SecretStr | None = None  # MODEL_BOSS_CLUSTER_SECRET; members' forwards
    advertise_url: str = ""  # how other members reach this one; default http://{host}:{port}
    host_id: str = ""  # this member's name in the cluster; default {hostname}:{port}
    cluster_heartbeat_s: float = Field(default=2.0, gt=0)
    cluster_member_ttl_s: float = Field(default=6.0, gt=0)  # a member is out after this
    cluster_load_lock_s: float = Field(default=10.0, gt=0)  # one load per model at a time
    cluster_job_claim_s: float = Field(default=30.0, gt=0)  # a dead member's jobs are taken

    @model_validator(mode="after")
    def _cluster_needs_redis(self) -> Self:
        if self.cluster:
            if not self.redis_url:
                raise ValueError("cluster: true needs redis_url (the Redis every member shares)")
            if self.cluster_secret is None or not self.cluster_secret.get_secret_value():
                raise ValueError("cluster: true needs cluster_secret (or the "
                                 "MODEL_BOSS_CLUSTER_SECRET environment variable)")
            if self.cluster_member_ttl_s <= self.cluster_heartbeat_s:
                raise ValueError("cluster_member_ttl_s must be longer than "
                                 "cluster_heartbeat_s")
        return self

    @property
    def member_id(self) -> str:
        """This coordinator's host id in a cluster."""
        return self.host_id or f"{socket.gethostname()}:{self.port}"

    @property
    def member_url(self) -> str:
        """The URL other members forward to."""
        return (self.advertise_url or f"http://{self.host}:{self.port}").rstrip("/")
