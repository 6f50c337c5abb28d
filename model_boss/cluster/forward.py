"""Forwarding a request to another member, and checking that a forward came from one.

A forward carries two headers: ``X-Model-Boss-Forwarded`` (the sending member's host id:
the receiver serves it itself, so a request makes one hop at most) and
``X-Model-Boss-Cluster-Secret``. A request with the first and without the right second is
refused (403) before anything else reads it. An
:class:`~model_boss.backends.upstream.UpstreamClient` per member carries the bytes (pooled
keep-alive HTTP/1.1, aiohttp for a member reached over https); streams pass through chunk by
chunk.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

import orjson

from ..backends.upstream import UpstreamClient, UpstreamReply, UpstreamTransportError
from .records import MemberRecord

FORWARDED_HEADER = "x-model-boss-forwarded"
SECRET_HEADER = "x-model-boss-cluster-secret"
MEMBER_HEADER = "x-model-boss-member"


class MemberUnreachable(Exception):
    """The member could not be reached (or broke the connection before answering)."""


def forward_refusal(headers: Mapping[str, str], secret: str | None) -> str | None:
    """Why a request that says it is a forward must be refused; None when it may pass (not
    a forward, or one with the cluster's secret)."""
    if FORWARDED_HEADER not in headers:
        return None
    if not secret:
        return "this coordinator is not a cluster member and takes no forwards"
    given = headers.get(SECRET_HEADER, "")
    if not hmac.compare_digest(given.encode(), secret.encode()):
        return "forward refused: missing or wrong cluster secret"
    return None


class Forwarder:
    """One pooled client per member URL."""

    def __init__(self, host_id: str, secret: str, *, timeout_s: float) -> None:
        self.host_id = host_id
        self._headers = {"content-type": "application/json", FORWARDED_HEADER: host_id,
                         SECRET_HEADER: secret}
        self.timeout_s = timeout_s
        self._clients: dict[str, UpstreamClient] = {}

    async def forward(self, member: MemberRecord, endpoint: str, body: dict[str, Any],
                      stream: bool) -> UpstreamReply:
        """Send ``body`` on to ``member``'s ``endpoint``; its answer as it came."""
        client = self._clients.get(member.url)
        if client is None:
            client = self._clients[member.url] = UpstreamClient(
                member.url, timeout_s=self.timeout_s, connect_timeout_s=3.0, peer="the member")
        try:
            return await client.post(endpoint, orjson.dumps(body), self._headers, stream)
        except UpstreamTransportError as exc:
            raise MemberUnreachable(f"member {member.host_id} ({member.url}): {exc}") from exc

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
