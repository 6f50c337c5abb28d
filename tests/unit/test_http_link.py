"""HttpLink (model_boss/backends/http_link.py) against servers that answer in the other ways
HTTP/1.1 allows: a body that ends where the server closes, a connection idle past its
keep-alive, a server that closes without answering. (Content-length, chunked streams and
time-outs: tests/unit/test_early_forward.py, against uvicorn.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys

import pytest

from model_boss.backends.http_link import HttpLink
from model_boss.backends.upstream import UpstreamClient, UpstreamTransportError


@contextlib.asynccontextmanager
async def raw_server(answer):
    """A server on a free loopback port; ``answer(reader, writer, connection_number)``
    handles each connection."""
    count = 0

    async def handle(reader, writer):
        nonlocal count
        count += 1
        try:
            await answer(reader, writer, count)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", lambda: count
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head + await reader.readexactly(length)


async def test_a_body_without_a_length_ends_where_the_server_closes():
    async def answer(reader, writer, _):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n"
                     b"first part, ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"and the rest")
        await writer.drain()

    async with raw_server(answer) as (url, connections):
        link = HttpLink(url, timeout_s=5, peer="the remote")
        for _ in range(2):  # not kept: the next request opens a new connection
            reply = await link.post("/x", b"{}", {}, stream=False)
            assert (reply.status, reply.content_type, reply.body) == \
                (200, "text/plain", b"first part, and the rest")
        assert connections() == 2
        streamed = await link.post("/x", b"{}", {}, stream=True)
        assert b"".join([c async for c in streamed.chunks]) == b"first part, and the rest"
        await link.close()


async def test_a_body_cut_short_of_its_length_is_a_transport_error_naming_the_peer():
    async def answer(reader, writer, _):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async with raw_server(answer) as (url, _):
        link = HttpLink(url, timeout_s=5, peer="the worker")
        with pytest.raises(UpstreamTransportError, match="the worker closed the connection"):
            await link.post("/x", b"{}", {}, stream=False)


async def test_a_connection_idle_past_its_keep_alive_is_not_reused():
    async def answer(reader, writer, _):
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()

    async with raw_server(answer) as (url, connections):
        link = HttpLink(url, timeout_s=5, keepalive_s=0.2)
        for _ in range(3):
            assert (await link.post("/x", b"{}", {}, stream=False)).body == b"ok"
        assert connections() == 1  # kept while in use
        await asyncio.sleep(0.3)
        assert (await link.post("/x", b"{}", {}, stream=False)).body == b"ok"
        assert connections() == 2  # idle too long: a fresh one
        await link.close()


async def test_a_server_that_closes_a_reused_connection_unanswered_is_asked_again():
    async def answer(reader, writer, number):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n%d" % (100 + number))
        await writer.drain()
        if number == 1:  # keeps the first connection open, then drops it unanswered
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await read_request(reader)

    async with raw_server(answer) as (url, connections):
        client = UpstreamClient(url, timeout_s=5)
        assert (await client.post("/x", b"{}", {}, stream=False)).body == b"101"
        assert (await client.post("/x", b"{}", {}, stream=False)).body == b"102"
        assert connections() == 2
        await client.close()


async def test_a_connection_closing_as_it_is_taken_is_not_used():
    """The server's end came and the close is under way, its connection_lost not yet run: the
    link takes another connection, whatever the last exchange on that one said."""
    async def answer(reader, writer, number):
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n%d" % (100 + number))
                await writer.drain()

    async with raw_server(answer) as (url, connections):
        link = HttpLink(url, timeout_s=5)
        assert (await link.post("/x", b"{}", {}, stream=False)).body == b"101"
        (pooled,) = link._idle
        pooled.transport.close()  # as on the server's FIN: closing, connection_lost to come
        assert (await link.post("/x", b"{}", {}, stream=False)).body == b"102"
        assert connections() == 2
        await link.close()


HTTPS_CLIENT = """
import asyncio, json, sys
from model_boss.backends.upstream import UpstreamClient, UpstreamTransportError

async def main(url, closed_url):
    client = UpstreamClient(url, timeout_s=5)
    whole = await client.post("/v1/x", b'{"a": 1}', {"content-type": "application/json"},
                              stream=False)
    streamed = await client.post("/v1/y", b"{}", {}, stream=True)
    chunks = [chunk async for chunk in streamed.chunks]
    await client.close()
    try:
        await UpstreamClient(closed_url, timeout_s=5).post("/", b"", {}, stream=False)
        failed = None
    except UpstreamTransportError as exc:
        failed = str(exc)
    print(json.dumps({"status": whole.status, "body": whole.body.decode(),
                      "retry_after": whole.retry_after, "stream_status": streamed.status,
                      "chunks": b"".join(chunks).decode(), "failed": failed}))

asyncio.run(main(*sys.argv[1:]))
"""


async def test_https_goes_through_aiohttp_and_trusts_what_ssl_cert_file_names(tmp_path):
    """A remote over https (a cloud API, a member behind TLS): aiohttp, imported only then,
    so ``SSL_CERT_FILE`` set for the process decides which authorities it trusts. The client
    runs in a process of its own, where that variable is set before anything reads it."""
    trustme = pytest.importorskip("trustme")
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_tls)
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    seen: list[bytes] = []

    async def handle(reader, writer):
        request = await reader.readuntil(b"\r\n\r\n")
        length = int(next((line.split(b":")[1] for line in request.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), b"0"))
        seen.append(request.split(b" ")[1] + b" " + await reader.readexactly(length))
        if request.startswith(b"POST /v1/x"):
            writer.write(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\n"
                         b"content-type: application/json\r\ncontent-length: 9\r\n\r\n"
                         b'{"b": 22}')
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n"
                         b"6\r\ndata: \r\n3\r\n1\n\n\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_tls)
    closed = await asyncio.start_server(handle, "127.0.0.1", 0)
    closed_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HTTPS_CLIENT, f"https://127.0.0.1:{port}",
        f"https://127.0.0.1:{closed_port}", stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "SSL_CERT_FILE": str(tmp_path / "ca.pem")})
    out, _ = await asyncio.wait_for(client.communicate(), 60)
    server.close()
    await server.wait_closed()
    assert client.returncode == 0
    answer = json.loads(out)
    assert answer["status"] == 429 and answer["body"] == '{"b": 22}'
    assert answer["retry_after"] == "7"
    assert answer["stream_status"] == 200 and answer["chunks"] == "data: 1\n\n"
    assert answer["failed"].startswith("ClientConnectorError")
    assert seen == [b'/v1/x {"a": 1}', b"/v1/y {}"]


def test_the_suite_builds_one_tls_context_per_process():
    """tests/shared_tls.py is in force (the conftest's hook): clients share the default
    context, and one with verification off still gets its own."""
    import httpx

    contexts = [client._transport._pool._ssl_context
                for client in (httpx.Client(), httpx.Client(), httpx.Client(verify=False))]
    assert contexts[0] is contexts[1]
    assert contexts[2] is not contexts[0] and contexts[2].verify_mode == ssl.CERT_NONE


def test_worker_control_clients_share_a_tls_context_that_trusts_no_one():
    """Built once (httpx would build one from certifi's bundle per client), and a client on it
    could not reach an https server even by mistake."""
    from model_boss.backends.http_link import plain_http_tls

    context = plain_http_tls()
    assert plain_http_tls() is context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 0
