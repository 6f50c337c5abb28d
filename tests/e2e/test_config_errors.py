"""A bad configuration stops ``model-boss serve`` with the file and the field named."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow


def serve(config_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model_boss", "serve", "--config",
                           str(config_path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("files, needle", [
    ({"mb.yaml": {"port": "eighty"}}, "mb.yaml: port"),
    ({"mb.yaml": {"manifests": ["m"]}, "m/bad.yaml": {"id": "x", "ctx_size": "big"}},
     "bad.yaml: ctx_size"),
    ({"mb.yaml": {"manifests": ["m"], "tasks_file": "tasks.yaml"},
      "m/ok.yaml": {"id": "ok", "path": "ok.gguf"},
      "tasks.yaml": {"tasks": {"chat": {"candidates": ["ok", "ghost"]}}}},
     "tasks.yaml: tasks.chat.candidates.1: unknown model 'ghost'"),
])
def test_serve_refuses_bad_config(tmp_path, files, needle):
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(content))
    done = serve(tmp_path / "mb.yaml")
    assert done.returncode == 2
    assert "configuration error" in done.stderr and needle in done.stderr
