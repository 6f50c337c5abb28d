#!/usr/bin/env bash
# Install the coding agents tests/e2e/test_agents.py runs, Claude Code and Codex, from npm into
# .venv/agents (a project-local prefix: nothing global is touched, and .venv is ignored by git).
# Usage: scripts/install_agents.sh [--if-missing]   (--if-missing: nothing to do when both are
# there). Without npm it says so and succeeds: the agent tests skip, naming what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.venv/agents
bin="$prefix/node_modules/.bin"
if [ "${1:-}" = "--if-missing" ] && [ -x "$bin/claude" ] && [ -x "$bin/codex" ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "NOTE: npm is not installed, so the coding-agent tests (tests/e2e/test_agents.py)" \
       "will be SKIPPED. Install Node.js 18 or later with npm, then scripts/install_agents.sh" >&2
  exit 0
fi
mkdir -p "$prefix"
# @latest: without it npm may settle for an older version its cache already holds
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
  @anthropic-ai/claude-code@latest @openai/codex@latest
"$bin/claude" --version && "$bin/codex" --version
