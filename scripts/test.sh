#!/usr/bin/env bash
# Install what is needed and run the whole test suite (pytest arguments pass through,
# e.g. scripts/test.sh -m "not slow" for the fast part only, or -n 0 for one process).
# Test files run in parallel (pytest-xdist, one file per process at a time so module-scoped
# coordinators stay whole, the longest first) on MODEL_BOSS_TEST_WORKERS processes (default 2)
# plus one more that runs only the files that mostly wait on timers (the unit and integration
# files, a few end-to-end ones): tests/xdist_order.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite starts hundreds of Python processes (coordinators, workers, clients). With
# PYTHONDONTWRITEBYTECODE set (some images set it), each would compile every module it imports
# from source again, and pytest would re-rewrite its plugins' asserts in every test process:
# here that cost the suite about a fifth of its time. Bytecode goes to __pycache__ (ignored).
unset PYTHONDONTWRITEBYTECODE
# clients: the OpenAI, Anthropic and Ollama clients the end-to-end tests drive (skipped without);
# realtime: silero-vad, the turn detection of /v1/realtime
scripts/setup.sh "llama,diffusion,transformers,realtime,tracing,test,clients"
# Claude Code and Codex for tests/e2e/test_agents.py, at the versions in
# scripts/agent_versions.txt, into .venv/agents where npm is and they are not (.ci/run installs
# them beside setup.sh). Without npm their tests skip; with npm, agents that failed to install
# fail their tests (the install's own error is printed here)
scripts/install_agents.sh --if-missing || echo "NOTE: installing the coding agents failed;" \
  "tests/e2e/test_agents.py will FAIL" >&2
.venv/bin/lint-imports  # the layer contract in pyproject.toml [tool.importlinter]
if ! command -v chromium >/dev/null && [ ! -x /usr/bin/chromium ]; then
  echo "NOTE: chromium is not installed, so the browser test (tests/e2e/test_dashboard.py)" \
       "will be SKIPPED. Install it with: apt-get install chromium" >&2
fi
if ! command -v espeak-ng >/dev/null; then
  echo "NOTE: espeak-ng is not installed, so the spoken-question tests (tests/e2e/test_realtime.py)" \
       "will be SKIPPED. Install it with: apt-get install espeak-ng" >&2
fi
exec .venv/bin/python -m pytest -n "$(( ${MODEL_BOSS_TEST_WORKERS:-2} + 1 ))" --dist loadfile \
  --no-loadscope-reorder --quiet-process "$@"
