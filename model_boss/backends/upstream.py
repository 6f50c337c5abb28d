"""UpstreamClient: the one pooled HTTP client for proxying to remote OpenAI-compatible APIs.

aiohttp rather than httpx on this path: under concurrency its connection pool costs a
fraction of httpcore's per request, and that is most of a proxy's overhead. Transport failures
come out as :class:`UpstreamTransportError`; nothing else in the code sees aiohttp.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp


class UpstreamTransportError(Exception):
    """The remote could not be reached, or broke the connection."""


@dataclass(slots=True)
class UpstreamReply:
    status: int
    content_type: str
    body: bytes | None
    chunks: AsyncIterator[bytes] | None
    retry_after: str | None = None  # the remote's Retry-After, on an error answer


class UpstreamClient:
    def __init__(self, base_url: str, *, timeout_s: float, connect_timeout_s: float = 10.0,
                 max_connections: int = 256, keepalive_s: float = 15.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._keepalive_s = keepalive_s
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                              sock_read=timeout_s)
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit,
                                               keepalive_timeout=self._keepalive_s),
                timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",))
        return self._session

    async def post(self, path: str, body: bytes, headers: dict[str, str],
                   stream: bool) -> UpstreamReply:
        try:
            try:
                response = await self._open().post(self.base_url + path, data=body,
                                                    headers=headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # a pooled keep-alive connection the server closed just as it was reused
                # (llama.cpp's server closes them on its own schedule): no answer came, so
                # try once more on a fresh connection
                response = await self._open().post(self.base_url + path, data=body,
                                                    headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamTransportError(f"{type(exc).__name__}: {exc}") from exc
        content_type = response.headers.get("content-type", "application/json")
        if stream and response.status < 400:
            return UpstreamReply(response.status, content_type, None, self._chunks(response))
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamTransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            response.release()
        return UpstreamReply(response.status, content_type, data, None,
                             response.headers.get("retry-after"))

    async def _chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamTransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            response.release()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
