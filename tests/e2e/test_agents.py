"""Coding agents, unchanged, against a real coordinator: Claude Code (``claude -p``, its
default tools, its stream-json output) and Codex (``codex exec``, then ``codex exec resume
--last``), each started by ``model-boss launch`` (base URL, key, model, its phone-home
switches off) on the demo model served with an 8k context, through a recording proxy
(tests/e2e/agent_recorder.py) that keeps what they send and what they are answered.

What is checked is what model-boss promises, not what a 135M model chooses to say: every
request an agent sent was answered right by its API (tests/e2e/agent_answers.py: the stream's
events, ids, tool calls, stop reason, bound and usage; Anthropic's wording where the prompt
outgrew the context), the coordinator logged each one as it was answered, and the run ended
as its last answer says it must. Claude Code's run is bounded in turns (``--max-turns``) and
in answer length (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``, which launch leaves to the user): whether
the model answers, calls a tool or rambles to the bound, the run ends within bounds and each
path is checked, none required.

What is fixed, and why: a greedy answer from a tiny model turns on every token of its prompt,
and the agents write the day and the machine into theirs (on 2026-12-06 Claude Code's "say
hi" was answered with 2,048 tokens, resumed, and grew past the context; the same test had
passed with an answer at once a week before). So the agents run at the versions pinned in
scripts/agent_versions.txt (the test refuses others), with HOME, the project folder and the
time zone the same on every machine, and the proxy pins the rest in each body before the
coordinator reads it (``PINS``): the date both agents write, and the OS version Claude Code
writes. A pin rather than a faked clock: Codex is a static binary that no preloaded library
reaches, and no clock tool fakes the kernel's version. Each first request must carry the pins,
so a release that words them otherwise fails here, not by the calendar.

The agents come from npm into .venv/agents (scripts/install_agents.sh, which scripts/test.sh
and .ci/run run); the tests skip, naming what is missing, only where there is no npm to
install them with: where npm is, an agent missing is a broken install, and fails.
``MODEL_BOSS_AGENTS_PREFIX=DIR`` runs the agents installed under DIR instead, whatever their
versions (scripts/agents_latest.sh: the newest releases). ``MODEL_BOSS_RECORD_AGENTS=1`` saves
each agent's first body, machine details scrubbed, to tests/data/agents/ (claude_code_first.json;
responses/codex_first.json), the bodies the API tests replay; ``=DIR`` saves them under DIR.

Slow by nature: Claude Code's first prompt is about 4,100 of this model's tokens and Codex's
about 4,400 (its template leaves the tool schemas out), prefilled on the CPU, and an answer
may run to Claude Code's 2,048-token cap."""

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
from tests.e2e.agent_answers import (
    message_text,
    messages_problems,
    output_tokens,
    responses_problems,
    stop_reason,
)
from tests.e2e.agent_recorder import Recorder

pytestmark = pytest.mark.slow

AGENTS_PREFIX = Path(os.environ.get("MODEL_BOSS_AGENTS_PREFIX") or ROOT / ".venv" / "agents")
PINNED = "MODEL_BOSS_AGENTS_PREFIX" not in os.environ  # else any version, as installed there
AGENT_BIN = AGENTS_PREFIX / "node_modules" / ".bin"
PATH = f"{AGENT_BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
VERSIONS = ROOT / "scripts" / "agent_versions.txt"
USER_KEY = "agents-user-key-0123456789"
ADMIN_KEY = "agents-admin-key-0123456789"
MODEL = "smol"
CONTEXT = 8192  # the manifest's, written out: the agents' prompts need it
# one agent run, on two cores the rest of the suite shares: there a 4,000-token prefill took
# 5 minutes and the answer (up to 2,048 tokens for Claude Code) came at 1.5 tokens a second
AGENT_TIMEOUT_S = 2400
# Claude Code's turns: an answer ends the run in the first; a tool call is run and its result
# sent back, and a second call ends it at the bound (error_max_turns)
MAX_TURNS = 2
# Claude Code's answer bound (launch keeps a user's own): the greedy answer to "say hi" ran to
# launch's 2,048 on 2026-12-06, was resumed twice to the context's end, and at 1.5 tokens a
# second on the suite's busy cores took most of a quarter of an hour
ANSWER_TOKENS = 256
# the day the agents' prompts say it is, and the OS version Claude Code's says it runs on:
# the day tests/data/agents was recorded, and that recording's scrubbed version
DAY = b"2026-11-29"
OS_VERSION = b"Linux 6.0.0"
PINS = ((re.compile(rb"Today's date is \d{4}-\d{2}-\d{2}"), b"Today's date is " + DAY),
        (re.compile(rb"OS Version: [^\\\"]*"), b"OS Version: " + OS_VERSION),
        (re.compile(rb"<current_date>[^<]*</current_date>"),
         b"<current_date>" + DAY + b"</current_date>"),
        (re.compile(rb"<timezone>[^<]*</timezone>"), b"<timezone>Etc/UTC</timezone>"))
DATA = ROOT / "tests" / "data" / "agents"
# what the agents' environment must not bring in from the caller's
FOREIGN = ("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "MODEL_BOSS_")


def installed(agent: str) -> str | None:
    return shutil.which(agent, path=PATH)


def pinned_versions() -> dict[str, str]:
    """Package name: version, from scripts/agent_versions.txt."""
    lines = [line.split() for line in VERSIONS.read_text().splitlines()]
    return {line[0]: line[1] for line in lines if line and not line[0].startswith("#")}


def version_problem(agent: str) -> str | None:
    """Why the installed ``agent`` is not the one pinned (None: it is, or pins are off)."""
    package = PACKAGES[agent]
    manifest = AGENTS_PREFIX / "node_modules" / package / "package.json"
    found = json.loads(manifest.read_text())["version"] if manifest.exists() else None
    wanted = pinned_versions()[package]
    if not PINNED or found == wanted:
        return None
    return (f"{package} {found} is installed, the tests are pinned to {wanted} "
            f"(scripts/agent_versions.txt): run scripts/install_agents.sh")


def needs(agent: str) -> pytest.MarkDecorator:
    """Skip only where the agent cannot be installed here (no npm): where npm is, the test
    command installs it, and its absence is a broken install, which fails."""
    return pytest.mark.skipif(
        installed(agent) is None and shutil.which("npm") is None,
        reason=f"{agent} is not installed and npm is not there to install it: with Node.js "
               f"and npm, scripts/test.sh installs {PACKAGES[agent]} into .venv/agents "
               f"(scripts/install_agents.sh)")


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
    with Recorder(server.url, pins=PINS) as proxy:
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


def launch(agent: str, recorder: Recorder, places: dict[str, Path], *agent_args: str,
           tuning: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """``model-boss launch AGENT -- ARGS`` as a user types it, with ``tuning`` in the
    environment as a user exports it; its result and seconds."""
    assert installed(agent), (f"{agent} is not installed though npm is: run "
                              f"scripts/install_agents.sh ({PACKAGES[agent]})")
    assert version_problem(agent) is None, version_problem(agent)
    env = {name: value for name, value in os.environ.items() if not name.startswith(FOREIGN)}
    env.update(HOME=str(places["home"]), PATH=PATH, MODEL_BOSS_API_KEY=USER_KEY, TZ="UTC",
               XDG_CONFIG_HOME=str(places["home"] / ".config"),
               XDG_CACHE_HOME=str(places["home"] / ".cache"), **(tuning or {}))
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


MESSAGES, RESPONSES = "/v1/messages", "/v1/responses"
CHECKS = {MESSAGES: messages_problems, RESPONSES: responses_problems}


def logged(server: ServerProcess) -> list[dict[str, Any]]:
    """The coordinator's finished requests, oldest first."""
    answer = httpx.get(server.url + "/api/v1/requests", params={"limit": 1000},
                       headers=server.headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return list(reversed(answer.json()["requests"]))


def answered_wrongly(recorder: Recorder, path: str) -> str:
    """Every answer on ``path`` that its API's rules refuse: what was sent, what is wrong."""
    found = []
    for number, exchange in enumerate(recorder.on(path)):
        problems = CHECKS[path](exchange, CONTEXT)
        if problems:
            found.append(f"#{number} {exchange.status} for {outline(exchange.body)}: "
                         f"{'; '.join(problems)}; answer {exchange.answer[:400]!r}")
    return "\n".join(found)


def log_disagrees(server: ServerProcess, recorder: Recorder, path: str) -> str | None:
    """Unless the coordinator logged each request on ``path`` as it was answered (ok where
    it answered 200, failed where it refused), what it logged and what was answered."""
    told = sorted("ok" if exchange.status == 200 else "failed"
                  for exchange in recorder.on(path))
    rows = sorted(row["status"] for row in logged(server) if row["endpoint"] == path)
    return None if rows == told else f"logged {rows}, answered {told}"


def outline(body: Any) -> str:
    if not isinstance(body, dict):
        return repr(body)[:200]
    turns = body.get("messages") or body.get("input") or []
    roles = [m.get("role") or m.get("type") for m in turns if isinstance(m, dict)]
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
    sent = "\n".join(f"#{number} {exchange.status} for {outline(exchange.body)}"
                     for number, exchange in enumerate(recorder.on(path)))
    return (f"exit {done.returncode} after {seconds:.0f} s\nstderr: {done.stderr[-3000:]}\n"
            f"stdout: {done.stdout[-2000:]}\nsent:\n{sent or 'nothing'}\n"
            f"answered wrongly: {answered_wrongly(recorder, path) or 'none'}\n"
            f"coordinator log: {server.log()[-2500:]}")


@needs("claude")
@pytest.mark.timeout(AGENT_TIMEOUT_S + 120)
def test_claude_code_runs_to_an_end_its_answers_explain(
        server: ServerProcess, recorder: Recorder, places: dict[str, Path]) -> None:
    """``claude -p "say hi" --max-turns 2 --output-format stream-json --verbose`` with answers
    bounded to 256 tokens: every request it made was answered right by the Messages API and
    logged as answered, and its last event is the result its last answer calls for:
    ``success`` with that answer's text where the model answered, ``error_max_turns`` where
    it still called a tool at the bound, Claude Code's ``max_output_tokens`` error where its
    answers ran to the bound (each cut at exactly 256) until it gave up resuming, an error
    where the prompt outgrew the context (refused in Anthropic's words)."""
    done, seconds = launch("claude", recorder, places, "-p", "say hi",
                           "--max-turns", str(MAX_TURNS),
                           "--output-format", "stream-json", "--verbose",
                           tuning={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(ANSWER_TOKENS)})
    print(f"\nclaude -p: {seconds:.0f} s")
    exchanges = recorder.on(MESSAGES)
    record("claude_code_first.json", exchanges[0].body if exchanges else None, places)
    explain = report(done, seconds, recorder, server, MESSAGES)
    # its prompts: the pinned day and OS version (an agent that words them otherwise is
    # another agent, and this test's prompt would follow the calendar again)
    assert exchanges and exchanges[0].pinned == 2, explain
    assert not answered_wrongly(recorder, MESSAGES), explain
    assert log_disagrees(server, recorder, MESSAGES) is None, \
        log_disagrees(server, recorder, MESSAGES)
    told = events(done.stdout)
    result = told[-1] if told else {}
    assert result.get("type") == "result", explain
    last = exchanges[-1]
    ended = stop_reason(last) if last.status == 200 else "refused"
    if ended in ("end_turn", "stop_sequence"):  # it answered: the answer is the result
        assert done.returncode == 0 and result.get("subtype") == "success", explain
        assert result.get("is_error") is False, explain
        assert result.get("result", "").strip() == message_text(last).strip(), explain
    elif ended == "tool_use":  # still calling tools at the bound
        assert result.get("subtype") == "error_max_turns", explain
        assert result.get("num_turns", 0) > MAX_TURNS, explain
    elif ended == "max_tokens":  # cut at the bound, resumed, cut again: Claude Code gives up
        assert done.returncode != 0 and result.get("is_error") is True, explain
        assert result.get("api_error") == "max_output_tokens", explain
        assert all(output_tokens(e) == ANSWER_TOKENS for e in exchanges), explain
    else:  # refused: the prompt outgrew the context, in the words Claude Code acts on
        assert ended == "refused" and last.status == 400, explain
        assert done.returncode != 0 and result.get("is_error") is True, explain
    print(f"claude -p ended at {ended} after {len(exchanges)} requests")
    assert "model-boss launch: ANTHROPIC_BASE_URL=" + recorder.url in done.stderr


@needs("codex")
@pytest.mark.timeout(2 * AGENT_TIMEOUT_S + 120)
def test_codex_exec_and_resume(server: ServerProcess, recorder: Recorder,
                               places: dict[str, Path]) -> None:
    """``codex exec "say hi"``, then ``codex exec resume --last "and again"``: both exit 0
    with an answer, every request answered right by the Responses API and logged as
    answered, the second carrying the first turn."""
    first, first_s = launch("codex", recorder, places, "exec", "--skip-git-repo-check",
                            "say hi")
    print(f"\ncodex exec: {first_s:.0f} s")
    exchanges = recorder.on(RESPONSES)
    record("responses/codex_first.json", exchanges[0].body if exchanges else None, places)
    explain = report(first, first_s, recorder, server, RESPONSES)
    assert exchanges and exchanges[0].pinned == 2, explain  # the pinned day and time zone
    assert first.returncode == 0 and first.stdout.strip(), explain
    again, again_s = launch("codex", recorder, places, "exec", "--skip-git-repo-check",
                            "resume", "--last", "and again")
    print(f"codex exec resume --last: {again_s:.0f} s")
    explain = report(again, again_s, recorder, server, RESPONSES)
    assert again.returncode == 0 and again.stdout.strip(), explain
    bodies = recorder.bodies(RESPONSES)
    assert len(bodies) >= 2 and "and again" in json.dumps(bodies[-1]), outline(bodies[-1])
    assert "say hi" in json.dumps(bodies[-1])  # the resumed session carries the first turn
    assert not answered_wrongly(recorder, RESPONSES), explain
    assert log_disagrees(server, recorder, RESPONSES) is None, \
        log_disagrees(server, recorder, RESPONSES)


# --- the bodies the API tests replay ---------------------------------------------------------

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DEVICE = re.compile(r"[0-9a-f]{64}")
OS_VERSION = re.compile(r"(OS Version: )[^\\\"]+")


def record(name: str, body: Any, places: dict[str, Path]) -> None:
    """Save ``body`` as tests/data/agents/NAME when ``MODEL_BOSS_RECORD_AGENTS`` asks."""
    wanted = os.environ.get("MODEL_BOSS_RECORD_AGENTS")
    if body is None or not wanted:
        return
    target = (DATA if wanted == "1" else Path(wanted)) / name
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
