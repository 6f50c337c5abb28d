"""MemberLink: keep-alive HTTP/1.1 connections from this member to one other member.

A forward is a second pass through a coordinator, and a large part of what it costs the
forwarding member is the HTTP client: with aiohttp's per-request machinery (request and
response objects, multidicts, payload registry, a writer task, timers) a loop of requests
to a peer on loopback costs 143 µs of CPU each (the peer's side included), with a pooled
asyncio protocol and httptools' parser (the one uvicorn serves with) 27 µs. The peer is
always another model-boss (uvicorn) over plain HTTP/1.1, so this client needs no more than:
POST a body; read the status, two headers and the body (content-length or chunked, as
httptools decodes it), a stream chunk by chunk with back-pressure. Members reached over
``https`` go through :class:`~model_boss.backends.upstream.UpstreamClient` instead.

A pooled connection the member closed just as it was reused (uvicorn drops idle ones after
a few seconds) is retried once on a fresh one, since no byte of an answer came back; any
other failure is an :class:`~model_boss.backends.upstream.UpstreamTransportError`. A caller
that stops waiting or stops reading closes the connection, so the member sees its client go.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from ..backends.upstream import UpstreamReply, UpstreamTransportError

_HIGH_WATER = 256 * 1024  # stream bytes held unread before the socket is paused


class _Connection(asyncio.Protocol):
    """One connection, one request at a time: the answer's status, headers and body."""

    def __init__(self, read_timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # it has carried a request before (a stale keep-alive may be closed)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = "application/json"
        self.retry_after: str | None = None
        self.answered = False  # some byte of the answer came back
        self.complete = False
        self.keep_alive = False
        self.error: Exception | None = None
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
            self._fail(UpstreamTransportError(f"bad answer from member: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(UpstreamTransportError(
                f"member closed the connection{f': {exc}' if exc else ''}"))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
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
                f"no answer from member in {self._read_timeout_s:g}s"))
        else:
            self._timer = self._loop.call_later(self._read_timeout_s - idle,
                                                self._check_timeout)

    def send(self, request: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamTransportError("the member closed the connection")
        if self.used:
            self._reset()
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


class MemberLink:
    """Pooled keep-alive connections to one member at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, *, timeout_s: float, connect_timeout_s: float = 3.0,
                 max_idle: int = 64) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"a member link needs an http:// URL, not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/").encode()
        self._host_header = parts.netloc.encode()
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
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
                    lambda: _Connection(self._timeout_s), self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamTransportError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    async def _answered(self, request: bytes) -> _Connection:
        """A connection that carried ``request`` and has the answer's headers."""
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, request)
            except UpstreamTransportError:
                if conn.answered:
                    raise
                # closed by the member as it was reused: no answer came, try the next one
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
