"""``model-boss launch AGENT [--model ID] [-- AGENT ARGS...]``: start a coding agent pointed
at this daemon, as ``ollama launch`` does. It asks the daemon for the model and its context,
refuses a model too small for the agent's first prompt, shows one line per thing it sets
(a key never in full, on stderr: the agent's own output stays clean), and replaces itself
with the agent."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from ..launch.agents import AGENTS
from ..launch.daemon import LaunchError, served_model
from ..launch.fit import find_manifest, needed_context, refusal
from ..launch.plan import Target
from .client import DaemonClient
from .command import Subparsers, add_command

EXAMPLES = ("model-boss launch claude --model qwen2.5-coder-7b",
            'model-boss launch codex --model qwen2.5-coder-7b -- exec "add a test for parse()"',
            "model-boss launch claude --dry-run        what it would set, and the command line")
PROMPT = "model-boss launch"
MANIFEST_FOLDERS = (Path("manifests"),)  # where the refusal looks for the file to edit
QUERY_TIMEOUT_S = 30.0
NOT_FOUND = 127  # a shell's status for a command it cannot find

Execute = Callable[[str, list[str], Mapping[str, str]], object]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="the model (an id or alias; default: the daemon's "
                                        "only chat model)")
    parser.add_argument("--key", help="the key the agent sends (default: $MODEL_BOSS_API_KEY, "
                                      "else $MODEL_BOSS_ADMIN_API_KEY, with a word against it)")
    parser.add_argument("--url", dest="launch_url", metavar="URL",
                        help="the daemon (default: model-boss --url, $MODEL_BOSS_URL, ...)")
    parser.add_argument("--dry-run", action="store_true",
                        help="show what would be set and print the command line; start nothing")


def add_parser(sub: Subparsers) -> None:
    names = ", ".join(AGENTS)
    parser = add_command(
        sub, "launch", run, summary=f"start a coding agent on a model of this daemon ({names})",
        description=f"Start a coding agent ({names}) with the environment and options it "
                    "needs to use this daemon's model, then hand over to it. What follows "
                    "the agent's name is its own, but for these options first; after -- "
                    "all of it is.",
        examples=EXAMPLES)
    parser.add_argument("agent", choices=list(AGENTS))
    _options(parser)
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="-- AGENT ARGS",
                        help="passed to the agent unchanged")


def run(args: argparse.Namespace, client: DaemonClient, environ: Mapping[str, str] | None = None,
        execute: Execute = os.execvpe, files_dir: Path | None = None,
        terminal: bool | None = None) -> int:
    """Launch ``args.agent`` on ``client``'s daemon (``--url`` wins) with the agent's key
    (:func:`agent_key`); ``execute`` replaces this process with it and ``terminal`` says
    whether stdin and stdout are one (None: ask; both are a test's seams). The status when it
    does not start."""
    environ = dict(os.environ if environ is None else environ)
    agent_args = _take_options(args)
    agent = AGENTS[args.agent]
    if terminal is None:
        terminal = sys.stdin.isatty() and sys.stdout.isatty()
    if not terminal and not args.dry_run and agent.interactive(agent_args):
        print(f"model-boss: {agent.name} needs a terminal (stdin and stdout are not one); "
              f"without one, run it non-interactively: model-boss launch {agent.name} "
              f"{agent.batch_example}", file=sys.stderr)
        return 2
    key, whose = agent_key(args.key, environ)
    daemon = DaemonClient(args.launch_url or client.url, key, transport=client.transport,
                          timeout=min(QUERY_TIMEOUT_S, client.timeout))
    url = daemon.url
    binary = shutil.which(agent.binary, path=environ.get("PATH", os.defpath))
    if binary is None and not args.dry_run:
        print(f"model-boss: {agent.binary} is not installed (not on PATH): {agent.install}",
              file=sys.stderr)
        return NOT_FOUND
    try:
        with daemon:
            model = served_model(daemon.http, args.model)
    except LaunchError as exc:
        print(f"model-boss: {exc.message}", file=sys.stderr)
        return exc.status
    problem = refusal(agent, model, find_manifest(model.id, MANIFEST_FOLDERS))
    if problem:
        print(f"model-boss: {problem}", file=sys.stderr)
        return 2
    launch = agent.build(Target(url, key, model.id, model.context), agent_args,
                         files_dir or _files_dir(environ))
    need = needed_context(agent)
    fits = f"; {agent.name} needs about {need:,}" if need else ""
    _say(f"{model.id}: a context of {model.context:,} tokens per request{fits}")
    _say(whose)
    if not args.dry_run:
        for path, content in launch.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    for line in launch.describe(environ, written=not args.dry_run):
        _say(line)
    if args.dry_run:
        print(shlex.join(launch.argv))
        return 0
    _say(f"starting {shlex.join([binary or agent.binary, *launch.argv[1:]])}")
    sys.stderr.flush()
    execute(binary or agent.binary, launch.argv, launch.environ(environ))
    return 0  # only where ``execute`` returns (a test's)


def agent_key(given: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The key the agent sends (and launch asks the daemon with), and a line saying whose it
    is: ``--key``, else ``$MODEL_BOSS_API_KEY``, else the admin's ``$MODEL_BOSS_ADMIN_API_KEY``
    (which the other commands send), with a word for a user key instead."""
    if given:
        return given, "the agent sends the key given with --key"
    if environ.get("MODEL_BOSS_API_KEY"):
        return environ["MODEL_BOSS_API_KEY"], "the agent sends $MODEL_BOSS_API_KEY"
    if environ.get("MODEL_BOSS_ADMIN_API_KEY"):
        return environ["MODEL_BOSS_ADMIN_API_KEY"], (
            "the agent sends the admin's key ($MODEL_BOSS_ADMIN_API_KEY): a user key is safer "
            "(model-boss keys create NAME, then --key or MODEL_BOSS_API_KEY)")
    return None, "the agent sends no key (none given, and no MODEL_BOSS_API_KEY set)"


# launch's own options where they follow the agent's name: their attribute, and whether a
# value follows
TRAILING = {"--model": ("model", True), "--key": ("key", True), "--url": ("launch_url", True),
            "--dry-run": ("dry_run", False)}


def _take_options(args: argparse.Namespace) -> list[str]:
    """The agent's arguments: what follows its name, but for launch's own options at the
    front (up to a ``--``; argparse drops a ``--`` right after the name itself)."""
    rest = list(args.rest)
    while rest:
        name, _, inline = rest[0].partition("=")
        if rest[0] == "--":
            return rest[1:]
        if name not in TRAILING:
            break
        attribute, takes_value = TRAILING[name]
        if not takes_value:
            setattr(args, attribute, True)
            rest = rest[1:]
        elif "=" in rest[0]:
            setattr(args, attribute, inline)
            rest = rest[1:]
        elif len(rest) >= 2:
            setattr(args, attribute, rest[1])
            rest = rest[2:]
        else:
            break  # a value missing: the agent's, then
    return rest


def _files_dir(environ: Mapping[str, str]) -> Path:
    cache = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(cache).expanduser() / "model-boss" / "launch"


def _say(line: str) -> None:
    print(f"{PROMPT}: {line}", file=sys.stderr)
