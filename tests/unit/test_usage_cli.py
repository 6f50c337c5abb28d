"""``model-boss usage``: the request it makes, its table, and one line when things fail."""

from __future__ import annotations

import argparse

import httpx
import pytest

from model_boss.cli import usage as cli_usage


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_usage.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["usage", *argv])


@pytest.fixture
def answers(monkeypatch):
    """httpx.get answered by the test: set ``answers.reply`` (a Response or an exception)."""
    state = argparse.Namespace(calls=[], reply=None)

    def fake_get(url, *, headers, params, timeout):
        state.calls.append((url, headers, params))
        if isinstance(state.reply, Exception):
            raise state.reply
        return state.reply

    monkeypatch.setattr(cli_usage.httpx, "get", fake_get)
    return state


ANSWER = {"from": "2025-05-01T00:00:00Z", "to": "2025-05-02T00:00:00Z",
          "group_by": ["key", "model"],
          "rows": [{"key": "team-a", "model": "smollm2", "requests": 1200,
                    "prompt_tokens": 150000, "completion_tokens": 90, "cached_tokens": 0,
                    "images": 0, "gpu_seconds": 12.5},
                   {"key": "", "model": "sdxl", "requests": 3, "prompt_tokens": 0,
                    "completion_tokens": 0, "cached_tokens": 0, "images": 6,
                    "gpu_seconds": 240.0}]}


def test_a_table_with_the_figures_that_matter(answers, capsys) -> None:
    answers.reply = httpx.Response(200, json=ANSWER)
    args = parse("--from", "2025-05-01", "--key", "team-a")
    assert cli_usage.run(args, "http://mb", {"authorization": "Bearer k"}) == 0
    url, headers, params = answers.calls[0]
    assert url == "http://mb/api/v1/usage" and headers == {"authorization": "Bearer k"}
    assert params == {"group_by": "key,model", "from": "2025-05-01", "key": "team-a",
                      "format": "json"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "from 2025-05-01T00:00:00Z to 2025-05-02T00:00:00Z"
    assert lines[1].split() == ["KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "IMAGES",
                                "GPU_S"]  # CACHED: zero in every row, left out
    assert lines[2].split() == ["team-a", "smollm2", "1,200", "150,000", "90", "0", "12.50"]
    assert lines[3].split() == ["-", "sdxl", "3", "0", "0", "6", "240.0"]
    assert len({len(line) for line in lines[1:]}) == 1  # aligned


def test_csv_is_the_daemons(answers, capsys) -> None:
    answers.reply = httpx.Response(200, text="key,requests\r\nteam-a,3\r\n")
    assert cli_usage.run(parse("--csv", "--group-by", "key"), "http://mb", {}) == 0
    assert answers.calls[0][2]["format"] == "csv"
    assert capsys.readouterr().out == "key,requests\r\nteam-a,3\r\n"


def test_an_error_is_one_line(answers, capsys) -> None:
    answers.reply = httpx.Response(400, json={"error": {
        "message": "from: 'x' is not an ISO 8601 date", "type": "invalid_request_error",
        "param": "from", "code": "invalid_request"}})
    assert cli_usage.run(parse("--from", "x"), "http://mb", {}) == 1
    assert capsys.readouterr().err == "model-boss: from: 'x' is not an ISO 8601 date\n"


def test_an_unreachable_daemon_is_one_line(answers, capsys) -> None:
    answers.reply = httpx.ConnectError("connection refused")
    assert cli_usage.run(parse(), "http://mb", {}) == 1
    err = capsys.readouterr().err
    assert err == "model-boss: cannot reach http://mb: connection refused\n"


def test_nothing_used(answers, capsys) -> None:
    answers.reply = httpx.Response(200, json={**ANSWER, "rows": []})
    assert cli_usage.run(parse(), "http://mb", {}) == 0
    assert capsys.readouterr().out.splitlines()[1] == "(no requests)"
