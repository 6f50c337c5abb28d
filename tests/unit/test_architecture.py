"""The house keeps its rooms: every room of model_boss has its place in the layers, and the
import contracts in pyproject.toml (the layers, no import circles with type-only and
function-level imports counted, the decisions that never act) are kept. There are no counts
of lines or modules to squeeze under: a module is split where its noun changes."""

from __future__ import annotations

import tomllib
from pathlib import Path

from importlinter import configuration
from importlinter.application import use_cases

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
ENTRY_POINTS = {"__init__", "__main__"}


def contracts() -> list[dict]:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]


def test_every_room_has_its_place_in_the_layers() -> None:
    layers = next(c for c in contracts() if c["type"] == "layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    rooms = {f"model_boss.{p.stem}" for p in (ROOT / "model_boss").iterdir()
             if (p.suffix == ".py" and p.stem not in ENTRY_POINTS)
             or (p.is_dir() and (p / "__init__.py").exists())}
    assert len(rooms) > 10  # a wrong ROOT would make this vacuous
    assert rooms <= placed, f"rooms in no layer of pyproject.toml: {sorted(rooms - placed)}"


def test_no_import_circles_counting_type_only_imports() -> None:
    acyclic = [c for c in contracts() if c["type"] == "acyclic_siblings"]
    assert acyclic and set(acyclic[0]["ancestors"]) == {"model_boss", "workers"}


def test_the_import_contracts_are_kept() -> None:
    configuration.configure()  # what the lint-imports command does first
    assert use_cases.lint_imports(config_filename=str(PYPROJECT), cache_dir=None,
                                  no_logo=True), "lint-imports names the import that broke one"
