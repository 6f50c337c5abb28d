"""UpstreamClient: the one pooled HTTP client for passing requests on (to a worker, a remote
OpenAI-compatible API, another member).

Over plain ``http`` it is :class:`~.http_link.HttpLink` (httptools on an asyncio protocol:
a fifth of aiohttp's CPU per request); over ``https``, aiohttp (rather than httpx: under
concurrency its connection pool costs a fraction of httpcore's per request). Transport
failures come out as :class:`UpstreamTransportError`; nothing else in the code sees either.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..trace_context import carried
from .http_link import HttpLink
from .reply import UpstreamReply, UpstreamTransportError

if TYPE_CHECKING:
    import aiohttp

__all__ = ["UpstreamClient", "UpstreamReply", "UpstreamTransportError"]


class UpstreamClient:
    def __init__(self, base_url: str, *, timeout_s: float, connect_timeout_s: float = 10.0,
                 max_connections: int = 256, keepalive_s: float = 15.0,
                 peer: str = "the remote") -> None:
        self.base_url = base_url.rstrip("/")
        self._keepalive_s = keepalive_s
        self._timeouts = (connect_timeout_s, timeout_s)
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None
        # plain http (workers, llama.cpp's server, most local remotes): the lean client
        plain = self.base_url.startswith("http://")
        self._link = HttpLink(self.base_url, timeout_s=timeout_s,
                              connect_timeout_s=connect_timeout_s, max_idle=max_connections,
                              keepalive_s=keepalive_s, peer=peer) if plain else None

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp  # here, for https only: it is a tenth of a coordinator's start-up CPU

        if self._session is None:
            connect_timeout_s, timeout_s = self._timeouts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit,
                                               keepalive_timeout=self._keepalive_s),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                              sock_read=timeout_s),
                auto_decompress=False, skip_auto_headers=("User-Agent",))
        return self._session

    async def post(self, path: str, body: bytes, headers: dict[str, str],
                   stream: bool) -> UpstreamReply:
        headers = carried(headers)  # the trace's context on to the worker or member
        if self._link is not None:
            return await self._link.post(path, body, headers, stream)
        import aiohttp

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
        import aiohttp

        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamTransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            response.release()

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
