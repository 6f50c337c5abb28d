"""The README's and the CLI's examples hold on the demo set-up (scripts/run.sh: the default
declared 8 GB GPU, its vram_margin_mb reserve, SmolLM2 loaded), and the README and
docs/API.md say one thing about Ollama's pull and delete: they are served."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

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
