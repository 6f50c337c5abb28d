#!/usr/bin/env bash
# Install what is needed and start model-boss on 127.0.0.1:8210 serving the demo model,
# with the embedded lease store (no Redis) and, without an NVIDIA GPU, a declared GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh llama
exec .venv/bin/model-boss serve "$@"
