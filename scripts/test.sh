#!/usr/bin/env bash
# Install what is needed and run the whole test suite (pytest arguments pass through,
# e.g. scripts/test.sh -m "not slow" for the fast part only).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "llama,diffusion,test"
exec .venv/bin/python -m pytest "$@"
