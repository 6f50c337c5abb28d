"""The command line's one daemon client (cli/client.py) against a real HTTP server on a free
port, and a port nothing listens on: a 2xx JSON answer parsed, the key sent as a bearer
token, a refusal in OpenAI's envelope and an unreachable daemon each said in one line."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from model_boss.cli.client import (
    DaemonClient,
    DaemonError,
    DaemonRefused,
    DaemonUnreachable,
    DaemonUnreadable,
    admin_key,
    report,
)

REFUSAL = {"error": {"message": "missing or invalid API key: send Authorization: Bearer <key>",
                     "type": "authentication_error", "param": None, "code": "invalid_api_key"}}


class Daemon(BaseHTTPRequestHandler):
    """``/ok`` answers the request it was sent, as JSON; ``/refused`` a 401 in OpenAI's
    envelope; ``/page`` a proxy's HTML; ``/lines`` three NDJSON lines."""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        sent = json.loads(self.rfile.read(length)) if length else None
        path = self.path.split("?")[0]
        if path == "/ok":
            self._send(200, json.dumps({"method": self.command, "path": self.path, "body": sent,
                                        "authorization": self.headers.get("authorization")}))
        elif path == "/refused":
            self._send(401, json.dumps(REFUSAL))
        elif path == "/page":
            self._send(200, "<html>a proxy's page</html>", "text/html")
        else:
            self._send(200, '{"n": 1}\n{"n": 2}\n{"n": 3}\n', "application/x-ndjson")

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass  # quiet


@pytest.fixture(scope="module")
def daemon_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Daemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_url() -> str:
    with socket.socket() as sock:  # bound, never listening, then closed: nothing answers
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _said(capsys: pytest.CaptureFixture[str], error: DaemonError) -> str:
    """What :func:`report` prints of ``error``: exactly one line on stderr, status 1."""
    assert report(error) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.endswith("\n")
    [line] = captured.err.splitlines()
    return line


def test_a_2xx_json_answer_is_parsed_and_the_key_sent_as_bearer(daemon_url) -> None:
    with DaemonClient(daemon_url + "/", "mb-admin-0123") as client:
        assert client.url == daemon_url  # a trailing slash dropped
        answer = client.post("/ok", {"source": "hf://o/r"})
        listed = client.get("/ok", params={"group_by": "key"})
    assert answer == {"method": "POST", "path": "/ok", "body": {"source": "hf://o/r"},
                      "authorization": "Bearer mb-admin-0123"}
    assert listed["path"] == "/ok?group_by=key" and listed["method"] == "GET"


def test_no_key_sends_no_authorization(daemon_url) -> None:
    with DaemonClient(daemon_url) as client:
        assert client.get("/ok")["authorization"] is None


def test_a_refusal_in_openais_envelope_is_its_message_in_one_line(daemon_url, capsys) -> None:
    with DaemonClient(daemon_url, "wrong") as client, \
            pytest.raises(DaemonRefused) as refused:
        client.get("/refused")
    assert refused.value.status == 401
    assert _said(capsys, refused.value) == ("model-boss: missing or invalid API key: send "
                                            "Authorization: Bearer <key>")


def test_an_unreachable_daemon_is_one_line_saying_why(closed_url, capsys) -> None:
    with DaemonClient(closed_url, "k") as client, pytest.raises(DaemonUnreachable) as failed:
        client.post("/api/v1/reload")
    assert (failed.value.url, failed.value.reason) == (
        closed_url, "connection refused (nothing listens there)")
    assert _said(capsys, failed.value) == (f"model-boss: cannot reach {closed_url}: "
                                           "connection refused (nothing listens there)")


def test_an_answer_that_is_not_json_is_one_line(daemon_url, capsys) -> None:
    with DaemonClient(daemon_url) as client, pytest.raises(DaemonUnreadable) as unread:
        client.get("/page")
    assert _said(capsys, unread.value) == (f"model-boss: {daemon_url}/page answered something "
                                           "other than JSON (HTTP 200): <html>a proxy's "
                                           "page</html>")


def test_text_is_the_answer_as_sent(daemon_url) -> None:
    with DaemonClient(daemon_url) as client:
        assert client.text("/lines") == '{"n": 1}\n{"n": 2}\n{"n": 3}\n'


def test_a_stream_reads_as_it_comes_and_refuses_like_the_rest(daemon_url, closed_url) -> None:
    with DaemonClient(daemon_url) as client:
        with client.stream("POST", "/lines", {"source": "x"}) as answer:
            assert [json.loads(line)["n"] for line in answer.iter_lines()] == [1, 2, 3]
        with pytest.raises(DaemonRefused, match="missing or invalid API key"), \
                client.stream("GET", "/refused"):
            pass
    with DaemonClient(closed_url) as client, pytest.raises(DaemonUnreachable), \
            client.stream("GET", "/api/v1/events"):
        pass


def test_a_document_of_another_shape_is_unreadable_not_a_traceback(daemon_url) -> None:
    client = DaemonClient(daemon_url)
    assert client.readable(lambda doc: doc["rows"], {"rows": 3}) == 3
    with pytest.raises(DaemonUnreadable, match="cannot read .KeyError: 'rows'.; is it a "
                                               "model-boss daemon of this version"):
        client.readable(lambda doc: doc["rows"], {"members": 3})


def test_a_bad_url_is_said_when_asked_not_when_the_client_is_made(capsys) -> None:
    client = DaemonClient("notaurl")  # ``serve`` makes one and never asks
    with pytest.raises(DaemonUnreachable) as failed:
        client.get("/api/v1/status")
    assert _said(capsys, failed.value) == ("model-boss: cannot reach notaurl: not an http:// "
                                           "or https:// URL")


@pytest.mark.parametrize("environ, key", [
    ({}, None),
    ({"MODEL_BOSS_API_KEY": "user"}, "user"),
    ({"MODEL_BOSS_API_KEY": "user", "MODEL_BOSS_ADMIN_API_KEY": "admin"}, "admin"),
    ({"MODEL_BOSS_API_KEY": "user", "MODEL_BOSS_ADMIN_API_KEY": ""}, "user"),
])
def test_the_admin_key_is_the_admin_variable_else_the_api_key(environ, key) -> None:
    assert admin_key(environ) == key
