"""Every command that talks to the daemon says what went wrong in one line on stderr and
exits 1: a refusal (a missing or wrong key), a daemon that cannot be reached, an answer that
is not JSON. None prints a traceback (model_boss/cli/: dispatch.py, watch.py, pull.py, keys.py
and usage.py)."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from model_boss.cli import main

# every command that asks the daemon, with the arguments it needs
COMMANDS = [
    ["ps"], ["ps", "--watch"], ["ps", "--cluster"], ["status"], ["load", "m"], ["unload", "m"],
    ["pin", "m"], ["unpin", "m"], ["pull", "hf://o/r:Q4_K_M"], ["rm", "m"], ["reload"],
    ["config"], ["config", "a=1"], ["leases"], ["leases", "acquire", "--vram-mb", "100"],
    ["leases", "release", "--id", "lease-1"], ["keys", "list"], ["keys", "create", "alice"],
    ["usage"], ["usage", "--csv"],
]


@pytest.fixture
def answering(monkeypatch):
    """Route the CLI's HTTP calls to a stand-in daemon; ``answering(status, body)`` sets what
    every route answers."""

    def install(status: int, body: bytes, content_type: str = "application/json") -> None:
        def handler(request: httpx.Request) -> httpx.Response:
            return httpx.Response(status, content=body, headers={"content-type": content_type})

        client = httpx.Client(transport=httpx.MockTransport(handler))

        def call(method: str, url: str, **kw: Any) -> httpx.Response:
            kw.pop("timeout", None)
            return client.request(method, url, **kw)

        def stream(method: str, url: str, **kw: Any):
            kw.pop("timeout", None)
            return client.stream(method, url, **kw)

        monkeypatch.setattr(httpx, "request", call)
        monkeypatch.setattr(httpx, "get", lambda url, **kw: call("GET", url, **kw))
        monkeypatch.setattr(httpx, "stream", stream)

    return install


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("model-boss: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_refusal_is_the_daemons_message_in_one_line(answering, capsys, argv):
    answering(401, b'{"error": {"message": "missing or invalid API key: send '
                   b'Authorization: Bearer <key>", "type": "authentication_error", '
                   b'"param": null, "code": "invalid_api_key"}}')
    assert main(["--url", "http://mb", *argv]) == 1
    line = _one_line(capsys)
    assert "missing or invalid API key" in line
    assert "{" not in line  # the message, not the envelope


# every command that reads JSON (``usage --csv`` asks for CSV, and prints what it is given)
READS_JSON = [argv for argv in COMMANDS if argv != ["usage", "--csv"]]


@pytest.mark.parametrize("argv", READS_JSON, ids=" ".join)
def test_an_answer_that_is_not_json_is_one_line(answering, capsys, argv):
    answering(200, b"<html>a proxy's page</html>", "text/html")
    assert main(["--url", "http://mb", *argv]) == 1
    _one_line(capsys)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_daemon_that_is_not_there_is_one_line_saying_why(capsys, argv):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["--url", f"http://127.0.0.1:{port}", *argv]) == 1
    line = _one_line(capsys)
    assert f"127.0.0.1:{port}" in line and "connection refused" in line


@pytest.mark.parametrize("argv", [["ps"], ["ps", "--cluster"], ["ps", "--watch"]])
def test_ps_from_a_daemon_that_speaks_another_shape_is_one_line(answering, capsys, argv):
    answering(200, b'{"enabled": true, "events": 5, "members": 3}')
    assert main(["--url", "http://mb", *argv]) == 1
    assert "cannot read" in _one_line(capsys)
