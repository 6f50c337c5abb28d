"""The README's and the CLI's examples hold on the demo set-up (scripts/run.sh: the default
declared 8 GB GPU, its vram_margin_mb reserve, SmolLM2 loaded), and the README and
docs/API.md say one thing about Ollama's pull and delete: they are served; every link from the
README and docs/ to a page here lands on a file and a heading there; "Add your models" names
real extras and sources."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from model_boss.catalog.hub_source import parse_source
from model_boss.cli.parser import TOP_EXAMPLES, build_parser
from model_boss.gpu.inventory import DEFAULT_DECLARED_MB
from model_boss.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
API = (ROOT / "docs" / "API.md").read_text()
DEMO_MODEL_MB = 305  # SmolLM2-135M's estimate on the demo (llama.cpp-fit)


def test_every_lease_example_fits_the_demo_gpu_beside_the_demo_model():
    room = DEFAULT_DECLARED_MB - Settings.model_fields["vram_margin_mb"].default - DEMO_MODEL_MB
    commands = next(action for action in build_parser({})._actions
                    if isinstance(action, argparse._SubParsersAction)).choices
    texts = [README, TOP_EXAMPLES, *(command.epilog for command in commands.values())]
    asked = [int(mb) for text in texts
             for mb in re.findall(r"(?:--vram-mb |vram_mb=)(\d+)", text)]
    assert asked, "no lease example found"
    assert all(mb <= room for mb in asked), (asked, room)


def test_ollama_pull_and_delete_read_the_same_everywhere():
    for text in (README, API):
        assert not re.search(r"`?pull`? and `?delete`? (are|is) refused", text)
        assert "Model management (pull, push, create, copy, delete, blobs) is refused" not in text
    assert "| POST | `/api/pull` |" in API and "| DELETE | `/api/delete` |" in API
    ollama = README.split("Ollama clients work unchanged")[1].split("```")[0]
    assert "`pull`" in ollama and "`delete`" in ollama and "refused" in ollama  # push and co.


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", *sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_every_link_to_a_file_here_names_a_file_and_heading_there(page):
    path = ROOT / page
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, broken


def test_add_your_models_names_real_extras_and_sources():
    section = README.split("## Add your models")[1].split("\n## ")[0]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    named = re.findall(r"bash scripts/setup\.sh ([\w,-]+)", section)
    assert named and all(extra in extras for line in named for extra in line.split(","))
    assert {"diffusion", "transformers"} <= {e for line in named for e in line.split(",")}
    sources = re.findall(r"model-boss pull (\S+)`", section)
    assert len(sources) == 3
    assert all(parse_source(source).repo for source in sources)
    # the check of this install it names is a command
    assert "`model-boss doctor`" in section
    assert build_parser({}).parse_args(["doctor"]).command == "doctor"
