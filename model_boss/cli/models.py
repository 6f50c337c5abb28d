"""``model-boss load | unload | pin | unpin | pull | rm | reload``: the models of a running
daemon. ``pull SOURCE``: the daemon pulls, this draws its progress: where it asks, each retry
while the hub does not answer (and why), one bar per file; a failure in one line that says
why and, when the hub cannot be reached, how to use a mirror."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .client import DaemonClient, DaemonError, DaemonUnreadable
from .command import Subparsers, add_command, print_json

VERBS = ("load", "unload", "pin", "unpin")  # POST /api/v1/models/{model}/{verb}

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


def add_parser(sub: Subparsers) -> None:
    for verb in VERBS:
        add_command(sub, verb, act, summary=f"{verb} a model",
                    examples=(f"model-boss {verb} smollm2-135m",)).add_argument("model")
    parser = add_command(
        sub, "pull", pull,
        summary="fetch a model from the Hugging Face Hub into the models folder and serve it: "
                "hf://ORG/REPO/FILE.gguf, hf://ORG/REPO:QUANT, or hf://ORG/REPO (a GGUF "
                "repository, or a transformers model's folder)",
        examples=("model-boss pull hf://bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M",
                  "model-boss pull hf://BAAI/bge-small-en-v1.5   (a transformers model's "
                  "folder)"),
        notes=SOURCE_FORMS + "\n")
    parser.add_argument("source", help="where from (the forms are listed below)")
    add_command(sub, "rm", remove, summary="delete a discovered or pulled model's files",
                examples=("model-boss rm qwen2.5-0.5b-instruct-q4_k_m",)).add_argument("model")
    add_command(sub, "reload", reload, summary="read manifests, tasks and the models folder "
                "again", examples=("model-boss reload",))


def act(args: argparse.Namespace, client: DaemonClient) -> int:
    """``load | unload | pin | unpin MODEL``: the daemon's answer as JSON."""
    return print_json(client.post(f"/api/v1/models/{args.model}/{args.command}"))


def remove(args: argparse.Namespace, client: DaemonClient) -> int:
    return print_json(client.delete(f"/api/v1/models/{args.model}"))


def reload(args: argparse.Namespace, client: DaemonClient) -> int:
    return print_json(client.post("/api/v1/reload"))


def pull(args: argparse.Namespace, client: DaemonClient) -> int:
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    last: dict[str, Any] = {}
    try:
        with client.stream("POST", "/api/v1/models/pull", {"source": args.source}) as response:
            for line in response.iter_lines():
                if not line.strip():
                    continue
                last = json.loads(line)
                if not isinstance(last, dict):
                    raise ValueError(f"a progress line that is not an object: {line[:80]}")
                _draw(bars, last)
    except ValueError as exc:
        raise DaemonUnreadable(f"{client.url} sent progress this command cannot read ({exc})"
                               ) from exc
    finally:
        for bar in bars.values():
            bar.close()
    if last.get("status") != "success":
        error = last.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        raise DaemonError(f"pull failed: {message or last or 'the daemon ended the answer'}")
    print(f"pulled {args.source}: serving it as '{last.get('model')}' ({last.get('path')})")
    return 0


def _draw(bars: dict, report: dict[str, Any]) -> None:
    """A progress line: a bar per file downloading; the rest as one line on stderr."""
    from tqdm import tqdm

    status = report.get("status")
    line = progress_line(report)
    if line:
        (tqdm.write if bars else print)(line, file=sys.stderr)
    if status != "downloading":
        return
    file = report["file"]
    bar = bars.get(file)
    if bar is None:
        bar = bars[file] = tqdm(total=report["total"], unit="B", unit_scale=True,
                                unit_divisor=1024, desc=file.rsplit("/", 1)[-1][:40])
    bar.update(report["completed"] - bar.n)


def progress_line(report: dict[str, Any]) -> str | None:
    """What a report says in words, or None for one a bar draws (or nothing to say)."""
    status = report.get("status")
    if status == "resolving":
        return f"asking {report.get('endpoint') or 'the hub'} for {report.get('source')} ..."
    if status == "retrying":
        what = f" ({report['file']})" if report.get("file") else ""
        return (f"no answer{what}: {report.get('reason') or 'unknown'}; retry "
                f"{report.get('attempt')} of {report.get('of')} in {report.get('wait_s', 0):g}s")
    if status == "verifying":
        return f"verifying {report.get('file')}"
    if status == "placed":
        return f"placed {report.get('file')}"
    return None
