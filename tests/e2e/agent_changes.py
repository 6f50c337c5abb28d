"""What changed between two recordings of the coding agents' first requests, for whoever moves
the pins in scripts/agent_versions.txt (scripts/agents_latest.sh prints it):

    python -m tests.e2e.agent_changes tests/data/agents NEW_DIR

For each body both folders hold (claude_code_first.json, responses/codex_first.json): the
top-level fields added and removed, the tools added and removed, the size of the system prompt
and of the messages, and whether the lines tests/e2e/test_agents.py pins (the day, the OS
version, the time zone) are still worded as its pins expect."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

BODIES = ("claude_code_first.json", "responses/codex_first.json")


def tools(body: dict[str, Any]) -> set[str]:
    return {tool.get("name") or tool.get("type") for tool in body.get("tools") or []}


def size(part: Any) -> int:
    return len(json.dumps(part, ensure_ascii=False)) if part is not None else 0


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    from tests.e2e.test_agents import PINS  # the pins, declared once

    said = []
    for label, before, after in (("fields", set(old), set(new)),
                                 ("tools", tools(old), tools(new))):
        if after - before:
            said.append(f"{label} added: {', '.join(sorted(after - before))}")
        if before - after:
            said.append(f"{label} removed: {', '.join(sorted(before - after))}")
    for part in ("system", "instructions", "messages", "input", "tools"):
        if part in old or part in new:
            said.append(f"{part}: {size(old.get(part)):,} characters, now "
                        f"{size(new.get(part)):,}")
    raw_old, raw_new = json.dumps(old).encode(), json.dumps(new).encode()
    for pattern, _ in PINS:
        was, now = bool(pattern.search(raw_old)), bool(pattern.search(raw_new))
        if was != now:
            said.append(f"the pin {pattern.pattern.decode()!r} "
                        f"{'no longer matches' if was else 'now matches'}")
    return said


def main() -> int:
    old_dir, new_dir = (Path(arg) for arg in sys.argv[1:3])
    for name in BODIES:
        old, new = old_dir / name, new_dir / name
        if not (old.exists() and new.exists()):
            print(f"{name}: {'not recorded now' if old.exists() else 'new'}")
            continue
        found = changes(json.loads(old.read_text()), json.loads(new.read_text()))
        print(f"{name}:" + "".join(f"\n  {line}" for line in found or ["no change"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
