"""Every command that talks to the daemon says what went wrong in one line on stderr and
exits 1: a refusal (a missing or wrong key), a daemon that cannot be reached, an answer that
is not JSON, a document of another shape. None prints a traceback (model_boss/cli/: every
command asks through client.py's DaemonClient)."""

from __future__ import annotations

import socket
from collections.abc import Callable

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
def answering() -> Callable[..., httpx.MockTransport]:
    """A stand-in daemon: ``answering(status, body)`` is a transport on which every route
    answers that."""

    def transport(status: int, body: bytes,
                  content_type: str = "application/json") -> httpx.MockTransport:
        return httpx.MockTransport(lambda request: httpx.Response(
            status, content=body, headers={"content-type": content_type}))

    return transport


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("model-boss: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_refusal_is_the_daemons_message_in_one_line(answering, capsys, argv):
    refusal = answering(401, b'{"error": {"message": "missing or invalid API key: send '
                             b'Authorization: Bearer <key>", "type": "authentication_error", '
                             b'"param": null, "code": "invalid_api_key"}}')
    assert main(["--url", "http://mb", *argv], transport=refusal) == 1
    line = _one_line(capsys)
    assert "missing or invalid API key" in line
    assert "{" not in line  # the message, not the envelope


# every command that reads JSON (``usage --csv`` asks for CSV, and prints what it is given)
READS_JSON = [argv for argv in COMMANDS if argv != ["usage", "--csv"]]


@pytest.mark.parametrize("argv", READS_JSON, ids=" ".join)
def test_an_answer_that_is_not_json_is_one_line(answering, capsys, argv):
    page = answering(200, b"<html>a proxy's page</html>", "text/html")
    assert main(["--url", "http://mb", *argv], transport=page) == 1
    _one_line(capsys)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_daemon_that_is_not_there_is_one_line_saying_why(capsys, argv):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["--url", f"http://127.0.0.1:{port}", *argv]) == 1
    line = _one_line(capsys)
    assert f"127.0.0.1:{port}" in line and "connection refused" in line


# every command that draws a table from the daemon's document
TABLES = [["ps"], ["ps", "--cluster"], ["ps", "--watch"], ["keys", "list"],
          ["keys", "create", "alice"], ["usage"]]


@pytest.mark.parametrize("argv", TABLES, ids=" ".join)
@pytest.mark.parametrize("body", [
    b'{"enabled": true, "events": 5, "members": 3, "keys": 5, "rows": 7}', b"[1, 2]"],
    ids=["object", "list"])
def test_a_document_of_another_shape_is_one_line(answering, capsys, argv, body):
    assert main(["--url", "http://mb", *argv], transport=answering(200, body)) == 1
    assert "cannot read" in _one_line(capsys)
