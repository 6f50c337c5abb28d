#!/usr/bin/env bash
# For whoever moves the agents' pins (scripts/agent_versions.txt): install the newest releases
# of Claude Code and Codex into .venv/agents-latest, run tests/e2e/test_agents.py against them,
# and say what changed: the versions, the tests' outcome, and how the agents' first requests
# differ from the recorded ones (tests/data/agents). Not part of scripts/test.sh: its outcome
# follows the releases. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.venv/agents-latest
bash scripts/install_agents.sh --latest --prefix "$prefix" >/dev/null
echo "pinned                          latest"
while read -r name version; do
  case "$name" in ''|'#'*) continue ;; esac
  latest=$(node -p 'require(process.argv[1]).version' "$PWD/$prefix/node_modules/$name/package.json")
  printf '%-31s %s%s\n' "$name $version" "$latest" "$([ "$latest" = "$version" ] || echo '  (changed)')"
done < scripts/agent_versions.txt
recorded=$(mktemp -d)
trap 'rm -rf "$recorded"' EXIT
status=0
MODEL_BOSS_AGENTS_PREFIX="$PWD/$prefix" MODEL_BOSS_RECORD_AGENTS="$recorded" \
  .venv/bin/python -m pytest tests/e2e/test_agents.py -p no:cacheprovider -n 0 -rA "$@" || status=$?
echo
echo "first requests, recorded (tests/data/agents) against the latest releases':"
.venv/bin/python -m tests.e2e.agent_changes tests/data/agents "$recorded"
exit "$status"
