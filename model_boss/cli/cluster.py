"""``model-boss ps --cluster``: the members and where each model is, as two tables."""

from __future__ import annotations

import time
from typing import Any


def format_cluster(data: dict[str, Any]) -> str:
    """The ``GET /api/v1/cluster`` document as text."""
    if not data.get("enabled"):
        return "not a cluster member (set cluster: true, redis_url and cluster_secret)"
    lines = [f"{'MEMBER':<24}{'URL':<28}{'GPUS':<22}{'MODELS':>7}{'QUEUE':>7}{'SEEN':>8}"]
    now = time.time()
    for member in data["members"]:
        gpus = ",".join(f"{g['index']}:{g['vram_mb']}MB" for g in member.get("gpus", []))
        name = member["host_id"] + (" *" if member.get("self") else "")
        seen = f"{max(0.0, now - member.get('updated_at', now)):.1f}s"
        lines.append(f"{name[:23]:<24}{member['url'][:27]:<28}{gpus[:21] or '-':<22}"
                     f"{len(member.get('slots', [])):>7}{member.get('queue_depth', 0):>7}"
                     f"{seen:>8}")
    lines.append("")
    lines.append(f"{'MODEL':<28}{'MEMBER':<24}{'STATE':<11}{'TIER':<6}{'ACTIVE':>7}"
                 f"{'QUEUED':>7}")
    for model, places in sorted(data["models"].items()):
        for place in places:
            lines.append(f"{model[:27]:<28}{place['host_id'][:23]:<24}{place['state']:<11}"
                         f"{place['tier']:<6}{place['active']:>7}{place['queued']:>7}")
    if not data["models"]:
        lines.append("(no model loaded on any member)")
    return "\n".join(lines)
