"""The command line's parser: every ``model-boss`` command, declared by its group's module
(``add_parser``: its help, an example, its ``run``), and which daemon the commands talk to
(:func:`default_url`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from ..settings import Settings
from . import config, doctor, keys, launch, leases, models, ps, serve, simulate, usage

# the command groups, in the order --help lists their commands
GROUPS = (serve, ps, models, config, leases, simulate, keys, usage, launch, doctor)

DEFAULT_PORT: int = Settings.model_fields["port"].default

ENVIRONMENT = f"""\
environment:
  MODEL_BOSS_URL             the daemon the commands talk to (--url wins over it)
  MODEL_BOSS_PORT            the daemon's port, when MODEL_BOSS_URL is unset: the CLI talks to
                             http://127.0.0.1:$MODEL_BOSS_PORT (default {DEFAULT_PORT}); `serve`
                             listens on it
  MODEL_BOSS_ADMIN_API_KEY   sent as the bearer key (else MODEL_BOSS_API_KEY)
"""

TOP_EXAMPLES = """\
examples:
  model-boss serve --config model-boss.yaml   run the daemon
  model-boss ps                               GPUs, their leases, and every model
  model-boss load smollm2-135m                load a model now
  MODEL_BOSS_PORT=8300 model-boss ps          talk to a daemon on another port
  model-boss keys create alice --models 'qwen*'   a key for one person (secret on the last line)
  model-boss usage --group-by key,day         what each key used today
  model-boss launch claude --model qwen2.5-coder-7b   Claude Code on a local model
  model-boss ps --help                        one command's options and an example
"""

def default_url(environ: Mapping[str, str] = os.environ) -> str:
    """``MODEL_BOSS_URL``, else ``http://127.0.0.1:$MODEL_BOSS_PORT`` (the port ``serve``
    listens on when set the same way), else the default port."""
    if environ.get("MODEL_BOSS_URL"):
        return environ["MODEL_BOSS_URL"]
    port = environ.get("MODEL_BOSS_PORT", "").strip() or DEFAULT_PORT
    return f"http://127.0.0.1:{port}"


def build_parser(environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """Every command and its options; ``environ`` gives the default ``--url``."""
    parser = argparse.ArgumentParser(
        prog="model-boss", description="A coordinator daemon serving local models.",
        epilog=TOP_EXAMPLES + "\n" + ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=default_url(environ),
                        help="the daemon (default: $MODEL_BOSS_URL, else "
                             "http://127.0.0.1:$MODEL_BOSS_PORT, else port "
                             f"{DEFAULT_PORT}; now %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for an answer (default 600)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parser(sub)
    return parser
