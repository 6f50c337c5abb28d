"""The house keeps its shape: small modules, small rooms. (Import circles and the layers
are import-linter's contracts in pyproject.toml, run by scripts/test.sh.)"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "model_boss", ROOT / "workers"]
MAX_MODULE_LINES = 400
MAX_MODULES_PER_FOLDER = 15


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in package.rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_the_tree_is_where_it_is_looked_for() -> None:
    assert len(_modules()) > 100  # a wrong ROOT would make the checks below vacuous


def test_no_module_is_past_its_size() -> None:
    limit = MAX_MODULE_LINES
    too_long = {str(p.relative_to(ROOT)): n for p in _modules()
                if (n := len(p.read_text().splitlines())) > limit}
    assert not too_long, f"modules over {limit} lines (split by noun): {too_long}"


def test_no_folder_holds_too_many_modules() -> None:
    folders: dict[Path, int] = {}
    for module in _modules():
        folders[module.parent] = folders.get(module.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items()
               if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules (make rooms): {crowded}"
