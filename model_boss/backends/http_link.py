"""HttpLink: pooled keep-alive HTTP/1.1 connections to one server over plain ``http``.

Most of what passing a request on costs the coordinator is its HTTP client: with aiohttp's
per-request machinery (request and response objects, multidicts, payload registry, a writer
task, timers) a loop of requests on loopback costs 143 µs of CPU each (the server's side
included), with a pooled asyncio protocol and httptools' parser (the one uvicorn serves with)
27 µs. Its peers (model-boss's own workers, llama.cpp's server, another member, a remote
reached over plain ``http``) need no more than: POST a body; read the status, two headers and
the body (content-length, chunked, or until the server closes), a stream chunk by chunk with
back-pressure. Remotes reached over ``https`` go through aiohttp
(:class:`~.upstream.UpstreamClient` picks).

A pooled connection the server closed just as it was reused (servers drop idle ones on their
own schedule) is retried once on a fresh one, since no byte of an answer came back; any other
failure is an :class:`~.upstream.UpstreamTransportError` naming the peer. A caller that stops
waiting or stops reading closes the connection, so the server sees its client go.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from .reply import UpstreamReply, UpstreamTransportError

_HIGH_WATER = 256 * 1024  # stream bytes held unread before the socket is paused


@functools.cache
def plain_http_tls() -> ssl.SSLContext:
    """The TLS context for an httpx client that speaks plain ``http`` to a worker on loopback
    (health, offload, reports). Left to itself httpx builds one from certifi's bundle for every
    client, 23 ms of CPU on the event loop at each worker start; this one is built once, loads
    no authority and so trusts none: such a client could not speak https even by mistake."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class _Connection(asyncio.Protocol):
    """One connection, one request at a time: the answer's status, headers and body."""

    def __init__(self, read_timeout_s: float, peer: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._peer = peer
        self._parser = httptools.HttpResponseParser(self)
        self._read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # it has carried a request before (a stale keep-alive may be closed)
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = "application/json"
        self.retry_after: str | None = None
        self.answered = False  # some byte of the answer came back
        self.complete = False
        self.keep_alive = False
        self.error: Exception | None = None
        self._until_close = True  # no length and no chunks said (yet): the body ends at close
        self._headers_done: asyncio.Future[None] = self._loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._wake: asyncio.Future[None] | None = None
        self._last_read = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.answered = True
        self._last_read = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamTransportError(f"bad answer from {self._peer}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and exc is None and self._until_close and self.status \
                and self.error is None:
            self.complete = True  # a body without a length or chunks ends where the server closes
            self._notify()
        if not self.complete:
            self._fail(UpstreamTransportError(
                f"{self._peer} closed the connection{f': {exc}' if exc else ''}"))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name == b"retry-after":
            self.retry_after = value.decode("latin-1")
        elif name in (b"content-length", b"transfer-encoding"):
            self._until_close = False

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.status in (204, 304):
            self._until_close = False
        if not self._headers_done.done():
            self._headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        self.complete = True
        # asked now: once the message is complete the parser no longer knows
        self.keep_alive = self._parser.should_keep_alive()
        self._notify()

    # -- the request -------------------------------------------------------------------------

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        if not self._headers_done.done():
            self._headers_done.set_exception(error)
            self._headers_done.exception()  # retrieved: a caller may be gone already
        self._notify()
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _check_timeout(self) -> None:
        idle = time.monotonic() - self._last_read
        if idle >= self._read_timeout_s:
            self._fail(UpstreamTransportError(
                f"no answer from {self._peer} in {self._read_timeout_s:g}s"))
        else:
            self._timer = self._loop.call_later(self._read_timeout_s - idle,
                                                self._check_timeout)

    def send(self, request: bytes) -> None:
        if self.used:
            self._reset()  # first: what is said of this exchange (``answered``) is its own
        if self.closing():
            raise UpstreamTransportError(f"{self._peer} closed the connection")
        self.used = True
        self._last_read = time.monotonic()
        self._timer = self._loop.call_later(self._read_timeout_s, self._check_timeout)
        assert self.transport is not None
        self.transport.write(request)

    async def headers(self) -> None:
        await self._headers_done

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        while not self._chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return None
            self._wake = self._loop.create_future()
            await self._wake
            self._wake = None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= _HIGH_WATER // 4 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def body(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def closing(self) -> bool:
        """Closed, or closing (the server's end came and the close is under way)."""
        return self.closed or self.transport is None or self.transport.is_closing()

    def done(self) -> bool:
        """Whether the connection may carry another request."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return self.complete and self.keep_alive and self.error is None and not self.closed

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class HttpLink:
    """Pooled keep-alive connections to the server at ``base_url`` (``http://host:port`` and
    a path prefix); ``peer`` names it in errors ("the worker", "member b")."""

    def __init__(self, base_url: str, *, timeout_s: float, connect_timeout_s: float = 3.0,
                 max_idle: int = 64, keepalive_s: float = 15.0,
                 peer: str = "the server") -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"an HTTP link needs an http:// URL, not {base_url!r}")
        self._peer = peer
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/").encode()
        self._host_header = parts.netloc.encode()
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
        self._keepalive_s = keepalive_s  # idle longer, a connection is dropped, not reused
        self._idle: list[_Connection] = []

    def _request(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
                         for k, v in headers.items())
        return (b"POST %s%s HTTP/1.1\r\nhost: %s\r\n%scontent-length: %d\r\n\r\n"
                % (self._prefix, path.encode(), self._host_header, lines, len(body))) + body

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._timeout_s, self._peer), self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamTransportError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    async def _answered(self, request: bytes) -> _Connection:
        """A connection that carried ``request`` and has the answer's headers."""
        while self._idle:
            conn = self._idle.pop()
            if conn.closing() or time.monotonic() - conn.idle_since > self._keepalive_s:
                conn.close()
                continue
            try:
                return await self._exchange(conn, request)
            except UpstreamTransportError:
                if conn.answered:
                    raise
                # closed by the server as it was reused: no answer came, try the next one
        return await self._exchange(await self._connect(), request)

    @staticmethod
    async def _exchange(conn: _Connection, request: bytes) -> _Connection:
        try:
            conn.send(request)
            await conn.headers()
        except BaseException:
            conn.close()
            raise
        return conn

    def _put_back(self, conn: _Connection) -> None:
        if conn.done() and len(self._idle) < self._max_idle:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    async def post(self, path: str, body: bytes, headers: dict[str, str],
                   stream: bool) -> UpstreamReply:
        """POST ``body``; the answer whole, or (``stream`` and a success) chunk by chunk."""
        conn = await self._answered(self._request(path, body, headers))
        if stream and conn.status < 400:
            return UpstreamReply(conn.status, conn.content_type, None, self._chunks(conn))
        try:
            data = await conn.body()
        except BaseException:
            conn.close()
            raise
        self._put_back(conn)
        return UpstreamReply(conn.status, conn.content_type, data, None, conn.retry_after)

    async def _chunks(self, conn: _Connection) -> AsyncIterator[bytes]:
        try:
            while (chunk := await conn.next_chunk()) is not None:
                yield chunk
        except BaseException:
            conn.close()
            raise
        self._put_back(conn)

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
