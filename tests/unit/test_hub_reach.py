"""A pull whose hub cannot be reached (catalog/hub_reach.py): each try and retry is reported
as it happens, and the failure says why (name resolution, refused, TLS) and how to use a
mirror; ``model-boss pull`` prints those lines as they come (cli/models.py)."""

from __future__ import annotations

import socket
import threading
import types
from typing import Any

import httpx
import pytest
from huggingface_hub.utils import _http as hub_http

from model_boss.catalog.hub_reach import HubUnavailable, in_words
from model_boss.catalog.pulls.download import parse_source, pull_files
from model_boss.cli import main
from model_boss.errors import network_reason
from tests.hub_standin import HubStandin


@pytest.fixture
def no_backoff(monkeypatch) -> list[float]:
    """The hub client's waits between retries, recorded instead of slept (1+2+4+8+8 s)."""
    import time

    waits: list[float] = []
    shim = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    monkeypatch.setattr(hub_http, "time", types.SimpleNamespace(**{**shim,
                                                                  "sleep": waits.append}))
    return waits


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pull(endpoint: str, tmp_path) -> tuple[list[dict[str, Any]], HubUnavailable]:
    reports: list[dict[str, Any]] = []
    with pytest.raises(HubUnavailable) as failed:
        pull_files(parse_source("hf://org/repo:Q4_K_M"), tmp_path, reports.append,
                   threading.Event(), endpoint=endpoint)
    return reports, failed.value


@pytest.mark.parametrize(("endpoint", "why"), [
    ("http://127.0.0.1:{closed}", "connection refused"),
    ("http://no-such-hub.invalid", "name resolution failed"),
    ("https://127.0.0.1:{plain}", "TLS handshake failed"),  # a plain-HTTP server spoken TLS to
])
def test_an_unreachable_hub_reports_each_retry_and_says_why_and_how_to_use_a_mirror(
        no_backoff, tmp_path, endpoint, why):
    with HubStandin() as plain:
        url = endpoint.format(closed=_closed_port(), plain=plain.url.rsplit(":", 1)[1])
        reports, error = _pull(url, tmp_path)
    assert reports[0] == {"status": "resolving", "source": "hf://org/repo:Q4_K_M",
                          "endpoint": url}
    retries = [r for r in reports if r["status"] == "retrying"]
    assert [(r["attempt"], r["of"]) for r in retries] == [(n, 5) for n in range(1, 6)]
    assert [r["wait_s"] for r in retries] == no_backoff == [1, 2, 4, 8, 8]
    assert all(r["reason"].startswith(why) for r in retries), retries
    assert f"the hub at {url} could not be reached" in error.message
    assert f"after 6 tries: {why}" in error.message
    assert "HF_ENDPOINT" in error.message and "hf_endpoint" in error.message
    assert error.status_code == 503 and error.headers()["Retry-After"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("url", "reason"), [
    ("http://127.0.0.1:{closed}/", "connection refused"),
    ("http://no-such-daemon.invalid/", "name resolution failed"),
    ("not a url", "not an http:// or https:// URL"),
])
def test_network_failures_are_named(url, reason):
    with pytest.raises(httpx.HTTPError) as failed:
        httpx.get(url.format(closed=_closed_port()), timeout=5)
    assert network_reason(failed.value).startswith(reason)


def test_a_retry_reason_is_said_in_words():
    assert in_words("[Errno -2] Name or service not known") == \
        "name resolution failed ([Errno -2] Name or service not known)"
    assert in_words("[Errno 111] Connection refused").startswith("connection refused")
    assert in_words("something else") == "something else"


def _daemon_says(lines: list[bytes], status: int = 200) -> httpx.MockTransport:
    """A stand-in daemon that answers with these NDJSON lines."""
    return httpx.MockTransport(lambda request: httpx.Response(
        status, content=b"".join(line + b"\n" for line in lines)))


def _pull_with_the_cli(source: str, daemon: httpx.MockTransport) -> int:
    return main(["--url", "http://daemon", "--timeout", "5", "pull", source], transport=daemon)


def test_the_cli_prints_each_try_as_it_comes_and_the_failure_in_one_line(capsys):
    daemon = _daemon_says([
        b'{"status": "resolving", "source": "hf://o/r:Q4_K_M", "endpoint": "https://hub"}',
        b'{"status": "retrying", "attempt": 1, "of": 5, "wait_s": 1.0, '
        b'"reason": "name resolution failed (x)"}',
        b'{"status": "failed", "error": {"message": "the hub at https://hub could not be '
        b'reached for hf://o/r:Q4_K_M after 6 tries: name resolution failed; set HF_ENDPOINT"}}'])
    assert _pull_with_the_cli("hf://o/r:Q4_K_M", daemon) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "asking https://hub for hf://o/r:Q4_K_M ...",
        "no answer: name resolution failed (x); retry 1 of 5 in 1s",
        "model-boss: pull failed: the hub at https://hub could not be reached for "
        "hf://o/r:Q4_K_M after 6 tries: name resolution failed; set HF_ENDPOINT"]


def test_the_cli_prints_a_refused_source_in_one_line(capsys):
    daemon = _daemon_says([b'{"error": {"message": "cannot pull \'hf://../../x.gguf\': the org '
                           b'\'..\' is not a valid Hugging Face Hub name"}}'], 400)
    assert _pull_with_the_cli("hf://../../x.gguf", daemon) == 1
    assert capsys.readouterr().err == ("model-boss: cannot pull 'hf://../../x.gguf': the org "
                                       "'..' is not a valid Hugging Face Hub name\n")


def test_pull_help_names_every_source_form(capsys):
    from model_boss.catalog.hub_source import FORMS

    with pytest.raises(SystemExit):
        main(["pull", "--help"])
    out = capsys.readouterr().out
    for form in (*FORMS, "hf.co/ORG/REPO", "huggingface.co/ORG/REPO", "HF_ENDPOINT"):
        assert form in out, form
    folder = next(line for line in out.splitlines() if line.strip().startswith("hf://ORG/REPO "))
    assert "GGUF repository" in folder and "folder" in out.split(folder)[1].split("hf.co")[0]
