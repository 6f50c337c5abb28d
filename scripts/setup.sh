#!/usr/bin/env bash
# Create or refresh .venv in the checkout, install model-boss with the given extras,
# and fetch the demo model. Usage: scripts/setup.sh [EXTRAS]   (default: llama)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-llama}"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip wheel
# Prebuilt wheels only (llama.cpp comes as xllamacpp); the optional llama-cpp-python extra compiles.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
.venv/bin/python scripts/fetch_demo_model.py
