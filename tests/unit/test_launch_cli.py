"""``model-boss launch``, its command line through the real parser: what it asks the daemon
(over a stand-in transport), its refusals (a missing agent, a model too small, an unknown
model, a refused key), the lines it shows, and the agent it hands over to with its own
arguments (a fake ``execvpe``)."""

from __future__ import annotations

import json
import os
import shlex
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_boss.cli import launch as launch_cli
from model_boss.cli.client import DaemonClient, DaemonUnreachable
from model_boss.cli.parser import build_parser
from model_boss.launch.daemon import LaunchError, served_model

KEY = "mb-secret-key-0123456789abcdef"
MODELS = [{"id": "smol", "aliases": ["smollm2:135m"], "category": "llm", "source": "manifest",
           "available": True},
          {"id": "embed", "category": "embedding", "available": True}]


class Daemon:
    """The daemon's two answers: ``/v1/models`` and ``/api/show`` (``num_ctx``)."""

    def __init__(self, models: list[dict[str, Any]] | None = None, num_ctx: int = 8192,
                 status: int = 200) -> None:
        self.models = MODELS if models is None else models
        self.num_ctx, self.status, self.calls = num_ctx, status, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path,
                           request.headers.get("authorization"),
                           json.loads(request.content) if request.content else None))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "no"}})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": self.models})
        return httpx.Response(200, json={"parameters": f"num_ctx {self.num_ctx}",
                                         "model_info": {"llama.context_length": 8192}})


@pytest.fixture
def agents_on_path(tmp_path: Path) -> Path:
    """A folder with an executable ``claude``, ``codex``, ``aider`` and ``opencode``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("claude", "codex", "aider", "opencode"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def launch(argv: list[str], daemon: Daemon, environ: dict[str, str],
           tmp_path: Path, terminal: bool = True,
           ) -> tuple[int, list[tuple[str, list[str], dict[str, str]]]]:
    """``model-boss ARGV`` through the real parser; the status and what it would exec."""
    args = build_parser({}).parse_args(argv)
    started: list[tuple[str, list[str], dict[str, str]]] = []
    # the admin's key, which the agent must not be given
    client = DaemonClient(args.url, "mb-admin-key", transport=httpx.MockTransport(daemon))
    status = launch_cli.run(args, client, environ,
                            execute=lambda path, argv, env: started.append(
                                (path, list(argv), dict(env))),
                            files_dir=tmp_path / "files", terminal=terminal)
    return status, started


def test_claude_is_started_with_the_daemons_model(agents_on_path, tmp_path, capsys) -> None:
    daemon = Daemon()
    environ = {"PATH": str(agents_on_path), "MODEL_BOSS_API_KEY": KEY,
               "ANTHROPIC_API_KEY": "sk-ant-real"}
    status, started = launch(["launch", "claude", "--", "-p", "say hi"], daemon, environ,
                             tmp_path)
    assert status == 0
    [(path, argv, env)] = started
    assert path == str(agents_on_path / "claude") and argv == ["claude", "-p", "say hi"]
    assert env["ANTHROPIC_MODEL"] == "smol" and env["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8210"
    assert "ANTHROPIC_API_KEY" not in env and env["PATH"] == str(agents_on_path)
    assert daemon.calls == [("GET", "/v1/models", f"Bearer {KEY}", None),
                            ("POST", "/api/show", f"Bearer {KEY}", {"model": "smol"})]
    err = capsys.readouterr().err
    assert KEY not in err
    assert "model-boss launch: smol: a context of 8,192 tokens per request; claude needs " \
           "about 8,137" in err
    assert "model-boss launch: unset ANTHROPIC_API_KEY" in err
    assert "model-boss launch: ANTHROPIC_AUTH_TOKEN=mb-s… (30 characters)" in err
    assert f"model-boss launch: starting {agents_on_path / 'claude'} -p 'say hi'" in err


@pytest.mark.parametrize("argv", [
    ["--url", "http://elsewhere:9000", "launch", "codex", "--model", "smollm2:135m"],
    ["launch", "--model", "smollm2:135m", "--url", "http://elsewhere:9000", "codex"],
    ["launch", "codex", "--url", "http://elsewhere:9000", "--model=smollm2:135m", "--"],
])
def test_options_before_or_after_the_agent(argv, agents_on_path, tmp_path) -> None:
    daemon = Daemon()
    status, started = launch([*argv, "exec", "say hi"] if argv[-1] == "--" else argv,
                             daemon, {"PATH": str(agents_on_path)}, tmp_path)
    assert status == 0
    [(_, codex_argv, env)] = started
    assert 'model="smol"' in codex_argv  # the alias resolved to the model's id
    assert any("base_url=\"http://elsewhere:9000/v1\"" in part for part in codex_argv)
    assert env["MODEL_BOSS_API_KEY"] == "model-boss"  # no key: the placeholder
    assert daemon.calls[0][2] is None  # and none sent to the daemon


@pytest.mark.parametrize(("after", "agent_args"), [
    (["-p", "say hi"], ["-p", "say hi"]),  # no --: the agent's all the same
    (["--dry-run", "--", "--model", "x"], ["--model", "x"]),  # after --, the agent's own
    (["--model", "smol", "exec", "--model", "x"], ["exec", "--model", "x"]),
    (["--key"], ["--key"]),  # an option without its value: not launch's
])
def test_what_follows_the_agent_is_its_own_but_launchs_options_first(
        after, agent_args, agents_on_path, tmp_path, capsys) -> None:
    status, started = launch(["launch", "claude", *after], Daemon(),
                             {"PATH": str(agents_on_path)}, tmp_path)
    assert status == 0
    if "--dry-run" in after:
        assert started == [] and capsys.readouterr().out == shlex.join(
            ["claude", *agent_args]) + "\n"
    else:
        assert started[0][1] == ["claude", *agent_args]


def test_a_missing_agent_names_its_package(tmp_path, capsys) -> None:
    daemon = Daemon()
    status, started = launch(["launch", "codex"], daemon, {"PATH": str(tmp_path)}, tmp_path)
    assert (status, started, daemon.calls) == (127, [], [])
    assert capsys.readouterr().err == "model-boss: codex is not installed (not on PATH): " \
                                      "npm install -g @openai/codex\n"


def test_a_model_too_small_is_refused_with_the_figures(agents_on_path, tmp_path, capsys,
                                                       monkeypatch) -> None:
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "smollm2.yaml").write_text("id: smol\nctx_size: 2048\n")
    monkeypatch.chdir(tmp_path)
    status, started = launch(["launch", "claude"], Daemon(num_ctx=2048),
                             {"PATH": str(agents_on_path)}, tmp_path)
    assert (status, started) == (2, [])
    assert capsys.readouterr().err == (
        "model-boss: smol has a context of 2,048 tokens; claude's first prompt alone is about "
        f"7,625 tokens: raise ctx_size in {Path('manifests/smollm2.yaml')} to 8192 or more "
        "(llama.cpp divides it among the parallel slots; the model was trained for 8,192)\n")


@pytest.mark.parametrize(("daemon", "status", "said"), [
    (Daemon(status=401), 1, "model-boss: http://127.0.0.1:8210 refused the key (401): set "
                            "MODEL_BOSS_API_KEY or pass --key\n"),
    (Daemon(status=500), 1, "model-boss: http://127.0.0.1:8210/v1/models answered 500: no\n"),
    (Daemon(models=[]), 2, "model-boss: which model? pass --model; the chat models at "
                           "http://127.0.0.1:8210: none\n"),
    (Daemon(models=[{**MODELS[0], "available": False, "unavailable_reason": "file missing"}]),
     2, "model-boss: 'smol' cannot be served now: file missing\n"),
])
def test_what_the_daemon_says_becomes_one_line(daemon, status, said, agents_on_path, tmp_path,
                                               capsys) -> None:
    assert launch(["launch", "claude"], daemon, {"PATH": str(agents_on_path)},
                  tmp_path) == (status, [])
    assert capsys.readouterr().err == said


def test_an_unknown_model_lists_the_chat_models(agents_on_path, tmp_path, capsys) -> None:
    two = [*MODELS, {"id": "qwen", "category": "llm", "available": True}]
    assert launch(["launch", "aider", "--model", "nope"], Daemon(models=two),
                  {"PATH": str(agents_on_path)}, tmp_path) == (2, [])
    assert capsys.readouterr().err == ("model-boss: no chat model 'nope' at "
                                       "http://127.0.0.1:8210; its chat models: smol, qwen\n")
    assert launch(["launch", "aider"], Daemon(models=two), {"PATH": str(agents_on_path)},
                  tmp_path) == (2, [])
    assert "which model? pass --model" in capsys.readouterr().err


def test_dry_run_prints_the_command_and_starts_nothing(tmp_path, capsys) -> None:
    # the agent need not be installed to see what launching it would take
    status, started = launch(["launch", "codex", "--dry-run", "--", "exec", "say hi"],
                             Daemon(), {"PATH": str(tmp_path)}, tmp_path)
    assert (status, started) == (0, [])
    out, err = capsys.readouterr()
    assert out.startswith("codex -c 'model_provider=\"modelboss\"' ")
    assert out.rstrip().endswith("exec 'say hi'")
    assert "model-boss launch: -c model_context_window=8192" in err
    assert not (tmp_path / "files").exists()


def test_aiders_metadata_file_is_written_before_it_starts(agents_on_path, tmp_path) -> None:
    status, started = launch(["launch", "aider", "--key", KEY], Daemon(num_ctx=16384),
                             {"PATH": str(agents_on_path), "MODEL_BOSS_API_KEY": "other"},
                             tmp_path)
    assert status == 0
    [(_, argv, env)] = started
    written = Path(argv[argv.index("--model-metadata-file") + 1])
    assert written.parent == tmp_path / "files"
    assert json.loads(written.read_text())["openai/smol"]["max_input_tokens"] == 16384
    assert env["OPENAI_API_KEY"] == KEY  # --key wins over the environment's


def test_a_context_in_the_models_list_wins(tmp_path) -> None:
    listed = [{**MODELS[0], "context_length": 32768}]
    with httpx.Client(base_url="http://mb", transport=httpx.MockTransport(
            Daemon(models=listed, num_ctx=2048))) as client:
        found = served_model(client, "smol")
    assert (found.id, found.context, found.trained, found.source) == \
        ("smol", 32768, 8192, "manifest")


def test_an_unreachable_daemon(tmp_path) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with httpx.Client(base_url="http://mb", transport=httpx.MockTransport(down)) as client, \
            pytest.raises(LaunchError) as caught:
        served_model(client, None)
    assert caught.value.message == "cannot reach http://mb: refused"
    assert caught.value.status == 1


def test_an_unreachable_daemon_is_worded_as_every_command_words_it(tmp_path, capsys) -> None:
    """A closed port: launch's line is the one ``ps`` (every DaemonClient command) prints,
    not the socket's ``[Errno 111]``."""
    with socket.socket() as sock:  # bound, never listening, then closed: nothing answers
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with DaemonClient(url) as client, pytest.raises(DaemonUnreachable) as unreachable:
        client.get("/api/v1/status")
    args = build_parser({}).parse_args(["launch", "claude", "--dry-run", "--url", url])
    status = launch_cli.run(args, DaemonClient(url), {"PATH": ""},
                            files_dir=tmp_path / "files", terminal=True)
    said = capsys.readouterr().err
    assert status == 1
    assert said == f"model-boss: {unreachable.value}\n"
    assert said == f"model-boss: cannot reach {url}: connection refused (nothing listens there)\n"


def test_the_files_go_to_the_users_cache() -> None:
    assert launch_cli._files_dir({"HOME": "/home/u"}) == \
        Path("/home/u/.cache/model-boss/launch")
    assert launch_cli._files_dir({"XDG_CACHE_HOME": "/c", "HOME": "/home/u"}) == \
        Path("/c/model-boss/launch")
    assert os.path.isabs(str(launch_cli._files_dir({})))


def test_the_admin_key_the_readme_exports_is_used_and_advised_against(agents_on_path, tmp_path,
                                                                     capsys) -> None:
    daemon = Daemon()
    status, started = launch(["launch", "codex", "--", "exec", "say hi"], daemon,
                             {"PATH": str(agents_on_path), "MODEL_BOSS_ADMIN_API_KEY": KEY},
                             tmp_path)
    assert status == 0
    [(_, _, env)] = started
    assert env["MODEL_BOSS_API_KEY"] == KEY
    assert [call[2] for call in daemon.calls] == [f"Bearer {KEY}"] * 2
    err = capsys.readouterr().err
    assert "model-boss launch: the agent sends the admin's key ($MODEL_BOSS_ADMIN_API_KEY): " \
           "a user key is safer (model-boss keys create NAME, then --key or " \
           "MODEL_BOSS_API_KEY)" in err
    assert KEY not in err


@pytest.mark.parametrize(("environ", "argv", "whose"), [
    ({"MODEL_BOSS_API_KEY": "user-key", "MODEL_BOSS_ADMIN_API_KEY": "admin-key"}, [],
     "the agent sends $MODEL_BOSS_API_KEY"),
    ({"MODEL_BOSS_API_KEY": "user-key"}, ["--key", "given-key"],
     "the agent sends the key given with --key"),
    ({}, [], "the agent sends no key (none given, and no MODEL_BOSS_API_KEY set)"),
])
def test_launch_says_whose_key_the_agent_sends(environ, argv, whose, agents_on_path, tmp_path,
                                               capsys) -> None:
    status, started = launch(["launch", "claude", *argv, "--", "-p", "hi"], Daemon(),
                             {"PATH": str(agents_on_path), **environ}, tmp_path)
    assert status == 0 and len(started) == 1
    assert f"model-boss launch: {whose}\n" in capsys.readouterr().err


def test_a_dry_run_writes_nothing_and_says_what_it_would(agents_on_path, tmp_path,
                                                        capsys) -> None:
    status, started = launch(["launch", "aider", "--dry-run"], Daemon(),
                             {"PATH": str(agents_on_path)}, tmp_path)
    assert (status, started) == (0, [])
    err = capsys.readouterr().err
    metadata = tmp_path / "files" / "aider-model-metadata.json"
    assert f"model-boss launch: would write {metadata}" in err and "wrote" not in err
    assert not metadata.exists() and not (tmp_path / "files").exists()


@pytest.mark.parametrize(("agent", "args", "example"), [
    ("codex", [], 'model-boss launch codex -- exec "PROMPT"'),
    ("claude", ["--", "--verbose"], 'model-boss launch claude -- -p "PROMPT"'),
    ("aider", [], 'model-boss launch aider -- --message "PROMPT"'),
    ("opencode", [], 'model-boss launch opencode -- run "PROMPT"'),
])
def test_an_interactive_agent_without_a_terminal_is_told_first(agent, args, example,
                                                               agents_on_path, tmp_path,
                                                               capsys) -> None:
    daemon = Daemon()
    status, started = launch(["launch", agent, *args], daemon, {"PATH": str(agents_on_path)},
                             tmp_path, terminal=False)
    assert (status, started, daemon.calls) == (2, [], [])
    assert capsys.readouterr().err == (
        f"model-boss: {agent} needs a terminal (stdin and stdout are not one); without one, "
        f"run it non-interactively: {example}\n")


@pytest.mark.parametrize(("agent", "args"), [
    ("codex", ["--", "exec", "say hi"]), ("claude", ["--", "-p", "say hi"]),
    ("aider", ["--", "--message=say hi"]), ("opencode", ["--", "run", "say hi"]),
])
def test_a_non_interactive_run_needs_no_terminal(agent, args, agents_on_path, tmp_path) -> None:
    status, started = launch(["launch", agent, *args], Daemon(), {"PATH": str(agents_on_path)},
                             tmp_path, terminal=False)
    assert status == 0 and len(started) == 1
