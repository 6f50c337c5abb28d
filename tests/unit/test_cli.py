"""The command line (cli/dispatch.py, parser.py): what ``ps`` prints from a status document,
which daemon the commands talk to, and that every command's help shows an example."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import pytest

from model_boss.cli import main
from model_boss.cli.parser import build_parser, default_url
from model_boss.gpu.inventory import GPUUsage
from model_boss.gpu.lease import Lease

NOW = 1_700_000_000.0


class Daemon:
    """A stand-in for the daemon's HTTP answers: ``status`` is what ``GET /api/v1/status``
    returns; ``urls`` the URLs asked for; ``transport`` carries the CLI's questions to it."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.urls: list[str] = []
        self.transport = httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return httpx.Response(200, json=self.status)


@pytest.fixture
def daemon() -> Daemon:
    return Daemon()


def _status_with_an_outside_lease() -> dict[str, Any]:
    """Two models of 400 and 345 MB on GPU 0 and a training run's 3000 MB there, taken over
    the lease API, plus a two-GPU lease: the shape /api/v1/status has."""
    leases = [
        Lease("lease-smol", "model-boss@box:10", "inference", {0: 400}, expires_at=NOW + 28),
        Lease("lease-qwen", "model-boss@box:10", "inference", {0: 345}, expires_at=NOW + 25),
        Lease("lease-train", "http:10.0.0.7", "training", {0: 3000}, expires_at=NOW + 150,
              note="finetune run 12"),
        Lease("lease-wide", "notebook@lab:77", "external", {0: 1000, 1: 2000},
              expires_at=NOW - 1),
    ]
    usage = [GPUUsage(0, "sim-24g", 24576, 4745, 19000, None, "declared"),
             GPUUsage(1, "sim-24g", 24576, 2000, 22000, None, "declared")]
    slot = {"state": "ready", "tier": "gpu", "pid": 42, "active_requests": 0, "pinned": False,
            "unload_at": NOW + 240, "vram_estimate": {"mb": 400, "rung": "measured"}}
    return {"time": NOW, "gpus": [u.to_dict() for u in usage],
            "slots": [{**slot, "model": "smollm2-135m", "lease": leases[0].to_dict()},
                      {**slot, "model": "qwen2.5-0.5b", "lease": leases[1].to_dict()}],
            "leases": [lease.to_dict() for lease in leases], "queue": {"depth": 0}}


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (split on runs of 2+ spaces) of the table whose header starts ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return rows


def test_ps_lists_every_lease_and_the_leased_figures_add_up(daemon, capsys):
    daemon.status = _status_with_an_outside_lease()
    assert main(["ps"], transport=daemon.transport) == 0
    out = capsys.readouterr().out
    leases = _table(out, "LEASE HOLDER")
    assert leases == [
        ["model-boss", "inference", "qwen2.5-0.5b", "0", "345", "25 seconds from now",
         "lease-qwen"],
        ["model-boss", "inference", "smollm2-135m", "0", "400", "28 seconds from now",
         "lease-smol"],
        ["http:10.0.0.7", "training", "finetune run 12", "0", "3000", "2 minutes from now",
         "lease-train"],
        ["notebook@lab:77", "external", "outside holder", "0", "1000", "expired",
         "lease-wide"],
        ["notebook@lab:77", "external", "outside holder", "1", "2000", "expired",
         "lease-wide"],
    ]
    gpus = {row[0]: row for row in _table(out, "GPU ")}
    for index, row in gpus.items():
        listed = sum(int(lease[4]) for lease in leases if lease[3] == index)
        assert int(row[-2]) == listed, f"GPU {index}: LEASED {row[-2]} != leases {listed}"
    assert gpus["0"][-2] == "4745" and gpus["1"][-2] == "2000"
    assert "leases: 4" in out


def test_ps_says_when_no_lease_is_held(daemon, capsys):
    daemon.status = {**_status_with_an_outside_lease(), "leases": [], "slots": []}
    assert main(["ps"], transport=daemon.transport) == 0
    out = capsys.readouterr().out
    assert "(no leases)" in out
    assert [row[-2] for row in _table(out, "GPU ")] == ["0", "0"]


@pytest.mark.parametrize("argv, env, url", [
    ([], {}, "http://127.0.0.1:8210"),
    ([], {"MODEL_BOSS_PORT": "8300"}, "http://127.0.0.1:8300"),
    ([], {"MODEL_BOSS_PORT": "8300", "MODEL_BOSS_URL": "http://gpu-box:9000"},
     "http://gpu-box:9000"),
    (["--url", "http://other:1"], {"MODEL_BOSS_PORT": "8300",
                                   "MODEL_BOSS_URL": "http://gpu-box:9000"}, "http://other:1"),
])
def test_the_daemon_is_url_else_model_boss_url_else_model_boss_port(
        daemon, monkeypatch, capsys, argv, env, url):
    for name in ("MODEL_BOSS_URL", "MODEL_BOSS_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    daemon.status = _status_with_an_outside_lease()
    assert main([*argv, "ps"], transport=daemon.transport) == 0
    assert daemon.urls == [url + "/api/v1/status"]
    if not argv:
        assert default_url(env) == url


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser({})
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_command_has_its_help_and_an_example(capsys):
    commands = _commands()
    assert {"serve", "ps", "status", "load", "pull", "leases", "simulate"} <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert "example:" in out, name
        assert any(line.startswith(f"  model-boss {name}") for line in out.splitlines()), name


def test_the_top_level_help_shows_examples_and_the_environment(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    examples = out.split("examples:")[1].split("environment:")[0]
    assert len([line for line in examples.splitlines()
                if line.startswith("  model-boss ")]) >= 3
    for name in ("MODEL_BOSS_URL", "MODEL_BOSS_PORT", "MODEL_BOSS_ADMIN_API_KEY"):
        assert name in out.split("environment:")[1]


def test_leases_acquire_sends_its_holder_and_note(capsys):
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, str(request.url), json.loads(request.content)))
        return httpx.Response(201, json={"id": "lease-1"})

    assert main(["--url", "http://mb", "leases", "acquire", "--vram-mb", "3000",
                 "--kind", "training", "--holder", "trainer-7", "--note", "nightly"],
                transport=httpx.MockTransport(answer)) == 0
    assert sent == [("POST", "http://mb/api/v1/leases",
                     {"vram_mb": 3000, "kind": "training", "holder": "trainer-7",
                      "note": "nightly"})]
    assert '"lease-1"' in capsys.readouterr().out


def test_serve_keeps_the_collector_off_what_lives_as_long_as_the_daemon():
    """Before serving, what exists is frozen (never scanned again) and the youngest objects
    are collected less often than Python's default; nothing else of the collector changes."""
    import gc

    from model_boss.daemon.start import YOUNG_COLLECTION_EVERY, quiet_collector

    threshold = gc.get_threshold()
    try:
        quiet_collector()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, *threshold[1:])
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
