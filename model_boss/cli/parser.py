"""The command line's parser: every ``model-boss`` command, an example of each in its
``--help``, and which daemon the admin commands talk to (:func:`default_url`)."""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Mapping

from ..settings import Settings
from . import keys as keys_cli
from . import launch as launch_cli
from . import simulate as simulate_cli
from . import usage as usage_cli

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

# one example per command, shown under its --help (simulate's: in simulation/cli.py)
EXAMPLES = {
    "serve": "model-boss serve --config /etc/model-boss.yaml --port 8210",
    "ps": "model-boss ps --watch",
    "status": "model-boss status > status.json",
    "load": "model-boss load smollm2-135m",
    "unload": "model-boss unload smollm2-135m",
    "pin": "model-boss pin smollm2-135m",
    "unpin": "model-boss unpin smollm2-135m",
    "pull": "model-boss pull hf://bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M\n"
            "  model-boss pull hf://BAAI/bge-small-en-v1.5   (a transformers model's folder)",
    "rm": "model-boss rm qwen2.5-0.5b-instruct-q4_k_m",
    "reload": "model-boss reload",
    "config": "model-boss config allowCloudFallback=false",
    "leases": "model-boss leases acquire --vram-mb 4000 --kind training --ttl-s 600 "
              "--holder trainer-7",
}


# every source form ``pull`` takes (catalog/hub_source.py parses them), under its --help
SOURCE_FORMS = """\
sources:
  hf://ORG/REPO/FILE.gguf   one GGUF file (the first part of a split one brings every part)
  hf://ORG/REPO:QUANT       the repository's GGUF of that quantization (Q4_K_M, IQ4_XS, ...),
                            with its vision projector when it has one
  hf://ORG/REPO             a GGUF repository: its one GGUF, else the preferred quantization
                            (Q4_K_M, Q4_K_S, Q4_0, Q5_K_M, Q8_0, F16); a repository with no GGUF
                            and a config.json (an embedder, reranker, Whisper, a voice): the
                            folder the transformers worker loads
  hf.co/ORG/REPO..., huggingface.co/ORG/REPO... and https://huggingface.co/ORG/REPO... are the
  same sources spelled Ollama's and the browser's way. The daemon pulls from HF_ENDPOINT (its
  environment) or hf_endpoint (its settings), else huggingface.co; HF_TOKEN for gated repos.
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

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=textwrap.fill(summary, 78),
                              epilog=f"example:\n  {EXAMPLES[name]}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    serve = command("serve", "run the daemon")
    serve.add_argument("--config", help="YAML settings file (or MODEL_BOSS_CONFIG)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int, help="(or MODEL_BOSS_PORT)")
    ps = command("ps", "GPUs, their leases, and every model of a running daemon and its state")
    ps.add_argument("--cluster", action="store_true",
                    help="every member of its cluster and their models")
    ps.add_argument("--watch", action="store_true",
                    help="redraw on every event; loads show their stage")
    command("status", "the full status document as JSON")
    for name in ("load", "unload", "pin", "unpin"):
        command(name, f"{name} a model").add_argument("model")
    pull = command("pull", "fetch a model from the Hugging Face Hub into the models folder "
                   "and serve it: hf://ORG/REPO/FILE.gguf, hf://ORG/REPO:QUANT, or "
                   "hf://ORG/REPO (a GGUF repository, or a transformers model's folder)")
    pull.epilog = SOURCE_FORMS + "\n" + pull.epilog
    pull.add_argument("source", help="where from (the forms are listed below)")
    command("rm", "delete a discovered or pulled model's files").add_argument("model")
    command("reload", "read manifests, tasks and the models folder again")
    config = command("config", "show or change runtime config")
    config.add_argument("assignments", nargs="*", help="key=value (true/false/numbers)")
    leases = command("leases", "list, take or release GPU leases")
    leases.add_argument("action", nargs="?", choices=["list", "acquire", "release"],
                        default="list")
    leases.add_argument("--vram-mb", type=int)
    leases.add_argument("--gpu", type=int)
    leases.add_argument("--kind", default="external")
    leases.add_argument("--ttl-s", type=float)
    leases.add_argument("--holder", help="who holds it (listed by ps and the dashboard)")
    leases.add_argument("--note", help="what it is for")
    leases.add_argument("--id", help="the lease to release (`model-boss ps` lists them)")
    simulate_cli.add_parser(sub)
    keys_cli.add_parser(sub)
    usage_cli.add_parser(sub)
    launch_cli.add_parser(sub)
    return parser
