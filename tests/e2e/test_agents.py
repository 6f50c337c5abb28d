"""Coding agents, unchanged, against a real coordinator: Claude Code (``claude -p``, its
default tools, its stream-json output) and Codex (``codex exec``, then ``codex exec resume
--last``), each started by ``model-boss launch`` (base URL, key, model, its phone-home
switches off) on the demo model served with an 8k context, through a recording proxy
(tests/e2e/agent_recorder.py) that keeps what they send. Each must end with a successful
result, and the coordinator's request log must show the routes they used.

The agents come from npm into .venv/agents (scripts/test.sh and .ci/run install them); the
tests skip, naming what is missing, without them. HOME is a temporary folder: no real config
is read or touched. ``MODEL_BOSS_RECORD_AGENTS=1`` saves each agent's first body, machine
details scrubbed, to tests/data/agents/ (claude_code_first.json;
responses/codex_first.json), the bodies the API tests replay.

Slow by nature: Claude Code's first prompt is about 4,200 of this model's tokens and Codex's
about 4,400 (its template leaves the tool schemas out), prefilled on the CPU. The model is
served greedy (its manifest's ``--temp 0``, a server default: the agents get no flag of
ours), so each run takes the same path: Claude Code answers in one request (102 s alone on
this box); sampled, a run sometimes wandered into tool calls until its prompt passed the
trained 8k context, and took half an hour on two busy cores."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, ServerProcess, llama_manifest
from tests.e2e.agent_recorder import Recorder

pytestmark = pytest.mark.slow

AGENT_BIN = ROOT / ".venv" / "agents" / "node_modules" / ".bin"
PATH = f"{AGENT_BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
USER_KEY = "agents-user-key-0123456789"
ADMIN_KEY = "agents-admin-key-0123456789"
MODEL = "smol"
CONTEXT = 8192  # the manifest's, written out: the agents' prompts need it
# one agent run, on two cores the rest of the suite shares: there a 4,000-token prefill took
# 5 minutes and the answer (up to 2,048 tokens for Claude Code) came at 1.5 tokens a second
AGENT_TIMEOUT_S = 2400
DATA = ROOT / "tests" / "data" / "agents"
# what the agents' environment must not bring in from the caller's
FOREIGN = ("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "MODEL_BOSS_")


def installed(agent: str) -> str | None:
    return shutil.which(agent, path=PATH)


def needs(agent: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        installed(agent) is None,
        reason=f"{agent} is not installed: scripts/test.sh installs {PACKAGES[agent]} into "
               f".venv/agents when npm is there (npm install --prefix .venv/agents "
               f"{PACKAGES[agent]})")


@pytest.fixture(scope="module")
def server(demo_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # greedy: a sampled answer from a 135M model wanders into tool calls on some runs and not
    # on others, and a run that calls tools grows past the trained context; the server's own
    # default, as a user sets it, so the agents are still started with no flag of ours
    manifest = llama_manifest(MODEL, demo_gguf, ctx_size=CONTEXT, parallel=1,
                              args=["--temp", "0", "--seed", "7"])
    process = ServerProcess(tmp_path_factory.mktemp("agents"),
                            {"api_key": USER_KEY, "admin_api_key": ADMIN_KEY}, [manifest],
                            headers={"authorization": f"Bearer {ADMIN_KEY}"})
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def recorder(server: ServerProcess) -> Iterator[Recorder]:
    with Recorder(server.url) as proxy:
        yield proxy


# The agents' HOME and project folder, at the same paths on every machine: the agents write
# their folder into their prompt, and a 135M model's greedy answer turns on such details (in
# one checkout it answered at once, in another it called tools until the prompt outgrew the
# context); with the same paths, today's prompt is the same wherever the suite runs
PLACES = Path(tempfile.gettempdir()) / "model-boss-agents"


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, Path]]:
    """The agents' HOME and the project folder they work in (empty, no git), made afresh."""
    shutil.rmtree(PLACES, ignore_errors=True)
    found = {"home": PLACES / "home", "work": PLACES / "project"}
    for folder in found.values():
        folder.mkdir(parents=True)
    yield found
    shutil.rmtree(PLACES, ignore_errors=True)


def launch(agent: str, recorder: Recorder, places: dict[str, Path],
           *agent_args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``model-boss launch AGENT -- ARGS`` as a user types it; its result and seconds."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(FOREIGN)}
    env.update(HOME=str(places["home"]), PATH=PATH, MODEL_BOSS_API_KEY=USER_KEY,
               XDG_CONFIG_HOME=str(places["home"] / ".config"),
               XDG_CACHE_HOME=str(places["home"] / ".cache"))
    command = [sys.executable, "-m", "model_boss", "launch", agent, "--url", recorder.url,
               "--model", MODEL, "--", *agent_args]
    started = time.monotonic()
    # a session of its own: the agent's node wrapper starts the agent's binary, and a run cut
    # short must take both down
    proc = subprocess.Popen(command, env=env, cwd=places["work"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=AGENT_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds = time.monotonic() - started
    return subprocess.CompletedProcess(command, proc.returncode, out, err), seconds


def logged(server: ServerProcess) -> list[dict[str, Any]]:
    """The coordinator's finished requests, oldest first."""
    answer = httpx.get(server.url + "/api/v1/requests", params={"limit": 1000},
                       headers=server.headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return list(reversed(answer.json()["requests"]))


def failures(recorder: Recorder, path: str) -> str:
    """Every refused request on ``path``: its body's outline and the answer."""
    return "\n".join(f"{e.status} {e.path}: sent {outline(e.body)}; answered "
                     f"{e.answer[:600].decode(errors='replace')}"
                     for e in recorder.exchanges if e.path == path and e.status >= 400)


def outline(body: Any) -> str:
    if not isinstance(body, dict):
        return repr(body)[:200]
    roles = [m.get("role") for m in body.get("messages", []) if isinstance(m, dict)]
    return (f"keys {sorted(body)}, roles {roles}, tools {len(body.get('tools') or [])}, "
            f"max_tokens {body.get('max_tokens')}")


def events(stdout: str) -> list[dict[str, Any]]:
    found = []
    for line in stdout.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def report(done: subprocess.CompletedProcess[str], seconds: float, recorder: Recorder,
           server: ServerProcess, path: str) -> str:
    return (f"exit {done.returncode} after {seconds:.0f} s\nstderr: {done.stderr[-3000:]}\n"
            f"stdout: {done.stdout[-2000:]}\nrefused: {failures(recorder, path) or 'none'}\n"
            f"coordinator log: {server.log()[-2500:]}")


@needs("claude")
@pytest.mark.timeout(AGENT_TIMEOUT_S + 120)
def test_claude_code_prints_an_answer(server: ServerProcess, recorder: Recorder,
                                      places: dict[str, Path]) -> None:
    """``claude -p "say hi" --output-format stream-json --verbose``: its last event is a
    successful result, and every request it made the coordinator took."""
    done, seconds = launch("claude", recorder, places, "-p", "say hi",
                           "--output-format", "stream-json", "--verbose")
    print(f"\nclaude -p: {seconds:.0f} s")
    sent = recorder.bodies("/v1/messages")
    record("claude_code_first.json", sent[0] if sent else None, places)
    told = events(done.stdout)
    result = told[-1] if told else {}
    assert done.returncode == 0 and result.get("type") == "result", \
        report(done, seconds, recorder, server, "/v1/messages")
    assert result.get("subtype") == "success" and result.get("is_error") is False, \
        report(done, seconds, recorder, server, "/v1/messages")
    assert not failures(recorder, "/v1/messages"), failures(recorder, "/v1/messages")
    served = [row for row in logged(server) if row["endpoint"] == "/v1/messages"]
    assert served and all(row["status"] == "ok" for row in served), served
    assert "model-boss launch: ANTHROPIC_BASE_URL=" + recorder.url in done.stderr


@needs("codex")
@pytest.mark.timeout(2 * AGENT_TIMEOUT_S + 120)
def test_codex_exec_and_resume(server: ServerProcess, recorder: Recorder,
                               places: dict[str, Path]) -> None:
    """``codex exec "say hi"``, then ``codex exec resume --last "and again"``: both exit 0
    with an answer, on the Responses API."""
    first, first_s = launch("codex", recorder, places, "exec", "--skip-git-repo-check",
                            "say hi")
    print(f"\ncodex exec: {first_s:.0f} s")
    sent = recorder.bodies("/v1/responses")
    record("responses/codex_first.json", sent[0] if sent else None, places)
    assert first.returncode == 0 and first.stdout.strip(), \
        report(first, first_s, recorder, server, "/v1/responses")
    again, again_s = launch("codex", recorder, places, "exec", "--skip-git-repo-check",
                            "resume", "--last", "and again")
    print(f"codex exec resume --last: {again_s:.0f} s")
    assert again.returncode == 0 and again.stdout.strip(), \
        report(again, again_s, recorder, server, "/v1/responses")
    bodies = recorder.bodies("/v1/responses")
    assert len(bodies) >= 2 and "and again" in json.dumps(bodies[-1]), outline(bodies[-1])
    assert "say hi" in json.dumps(bodies[-1])  # the resumed session carries the first turn
    assert not failures(recorder, "/v1/responses"), failures(recorder, "/v1/responses")
    served = [row for row in logged(server) if row["endpoint"] == "/v1/responses"]
    assert len(served) >= 2 and all(row["status"] == "ok" for row in served), served


# --- the bodies the API tests replay ---------------------------------------------------------

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DEVICE = re.compile(r"[0-9a-f]{64}")
OS_VERSION = re.compile(r"(OS Version: )[^\\\"]+")


def record(name: str, body: Any, places: dict[str, Path]) -> None:
    """Save ``body`` as tests/data/agents/NAME when ``MODEL_BOSS_RECORD_AGENTS`` asks."""
    if body is None or not os.environ.get("MODEL_BOSS_RECORD_AGENTS"):
        return
    target = DATA / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(scrub(json.dumps(body, indent=1, ensure_ascii=False), places) + "\n")


def scrub(text: str, places: dict[str, Path]) -> str:
    """The machine out of a body: its folders, ids, host and kernel become placeholders."""
    for path, placeholder in ((places["work"], "/home/user/project"),
                              (places["home"], "/home/user"), (ROOT, "/home/user/model-boss")):
        text = text.replace(str(path), placeholder)
        # Claude Code names a project's folder under ~/.claude/projects by its path, / as -
        text = text.replace(str(path).replace("/", "-"), placeholder.replace("/", "-"))
    text = UUID.sub("00000000-0000-4000-8000-000000000000", text)
    text = DEVICE.sub("0" * 64, text)
    host = os.uname().nodename
    if len(host) > 3:
        text = text.replace(host, "host")
    return OS_VERSION.sub(r"\1Linux 6.0.0", text)
