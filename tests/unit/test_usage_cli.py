"""``model-boss usage``: the request it makes, its table, and one line when things fail."""

from __future__ import annotations

import argparse

import httpx
import pytest

from model_boss.cli import main


@pytest.fixture
def answers():
    """A stand-in daemon: set ``answers.reply`` (a Response or an exception); ``answers.calls``
    holds what it was asked; ``answers.usage(*argv)`` runs ``model-boss usage`` against it."""
    state = argparse.Namespace(calls=[], reply=None)

    def answer(request: httpx.Request) -> httpx.Response:
        state.calls.append((str(request.url.copy_with(query=None)),
                            request.headers.get("authorization"), dict(request.url.params)))
        if isinstance(state.reply, Exception):
            raise state.reply
        return state.reply

    state.usage = lambda *argv: main(["--url", "http://mb", "usage", *argv],
                                     transport=httpx.MockTransport(answer))
    return state


ANSWER = {"from": "2025-05-01T00:00:00Z", "to": "2025-05-02T00:00:00Z",
          "group_by": ["key", "model"],
          "rows": [{"key": "team-a", "model": "smollm2", "requests": 1200,
                    "prompt_tokens": 150000, "completion_tokens": 90, "cached_tokens": 0,
                    "images": 0, "gpu_seconds": 12.5},
                   {"key": "", "model": "sdxl", "requests": 3, "prompt_tokens": 0,
                    "completion_tokens": 0, "cached_tokens": 0, "images": 6,
                    "gpu_seconds": 240.0}]}


def test_a_table_with_the_figures_that_matter(answers, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MODEL_BOSS_ADMIN_API_KEY", "k")
    answers.reply = httpx.Response(200, json=ANSWER)
    assert answers.usage("--from", "2025-05-01", "--key", "team-a") == 0
    url, authorization, params = answers.calls[0]
    assert url == "http://mb/api/v1/usage" and authorization == "Bearer k"
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
    assert answers.usage("--csv", "--group-by", "key") == 0
    assert answers.calls[0][2]["format"] == "csv"
    assert capsys.readouterr().out == "key,requests\r\nteam-a,3\r\n"


def test_an_error_is_one_line(answers, capsys) -> None:
    answers.reply = httpx.Response(400, json={"error": {
        "message": "from: 'x' is not an ISO 8601 date", "type": "invalid_request_error",
        "param": "from", "code": "invalid_request"}})
    assert answers.usage("--from", "x") == 1
    assert capsys.readouterr().err == "model-boss: from: 'x' is not an ISO 8601 date\n"


def test_an_unreachable_daemon_is_one_line(answers, capsys) -> None:
    answers.reply = httpx.ConnectError("connection refused")
    assert answers.usage() == 1
    err = capsys.readouterr().err
    assert err == "model-boss: cannot reach http://mb: connection refused\n"


def test_nothing_used(answers, capsys) -> None:
    answers.reply = httpx.Response(200, json={**ANSWER, "rows": []})
    assert answers.usage() == 0
    assert capsys.readouterr().out.splitlines()[1] == "(no requests)"
