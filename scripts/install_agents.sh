#!/usr/bin/env bash
# Install the coding agents tests/e2e/test_agents.py runs, Claude Code and Codex, from npm into
# .venv/agents (a project-local prefix: nothing global is touched, and .venv is ignored by git),
# at the versions pinned in scripts/agent_versions.txt.
# Usage: scripts/install_agents.sh [--if-missing] [--prefix DIR] [--latest]
#   --if-missing: nothing to do when the pinned versions are there already
#   --prefix DIR: install into DIR instead of .venv/agents
#   --latest: the newest releases instead of the pins (scripts/agents_latest.sh uses it)
# Without npm it says so and succeeds: the agent tests skip, naming what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.venv/agents
if_missing=""
latest=""
while [ $# -gt 0 ]; do
  case "$1" in
    --if-missing) if_missing=1 ;;
    --prefix) prefix="$2"; shift ;;
    --latest) latest=1 ;;
    *) echo "usage: $0 [--if-missing] [--prefix DIR] [--latest]" >&2; exit 2 ;;
  esac
  shift
done
prefix=$(realpath -m "$prefix")
packages=()
while read -r name version; do
  case "$name" in ''|'#'*) continue ;; esac
  if [ -n "$latest" ]; then packages+=("$name@latest"); else packages+=("$name@$version"); fi
done < scripts/agent_versions.txt
installed() {  # every pinned package at its pinned version under $prefix
  while read -r name version; do
    case "$name" in ''|'#'*) continue ;; esac
    manifest="$prefix/node_modules/$name/package.json"
    [ -f "$manifest" ] || return 1
    found=$(node -p 'require(process.argv[1]).version' "$manifest" 2>/dev/null) || return 1
    [ "$found" = "$version" ] || return 1
  done < scripts/agent_versions.txt
}
if [ -n "$if_missing" ] && [ -z "$latest" ] && installed; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "NOTE: npm is not installed, so the coding-agent tests (tests/e2e/test_agents.py)" \
       "will be SKIPPED. Install Node.js 18 or later with npm, then scripts/install_agents.sh" >&2
  exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "${packages[@]}"
"$prefix/node_modules/.bin/claude" --version && "$prefix/node_modules/.bin/codex" --version
