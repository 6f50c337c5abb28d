"""What a llama.cpp server says about itself: ``/props``, ``/slots``, ``/metrics``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psutil

# llama.cpp's Prometheus names (``llamacpp:`` prefix) kept in a report
METRICS = ("requests_processing", "requests_deferred", "prompt_tokens_total",
           "tokens_predicted_total", "prompt_tokens_seconds", "predicted_tokens_seconds",
           "n_tokens_max", "kv_cache_usage_ratio", "kv_cache_tokens",
           "prompt_tokens_cached_total", "spec_decode_num_drafts_total",
           "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


def draft_figures(metrics: dict[str, float]) -> dict[str, Any] | None:
    """A draft model's work as its server counts it: tokens drafted, tokens the model
    accepted, and their ratio (None before anything was drafted)."""
    drafted = metrics.get("spec_decode_num_draft_tokens_total")
    if not drafted:
        return None
    accepted = metrics.get("spec_decode_num_accepted_tokens_total", 0.0)
    return {"drafted_tokens": int(drafted), "accepted_tokens": int(accepted),
            "acceptance_rate": round(accepted / drafted, 4)}


async def _get(client: httpx.AsyncClient, path: str) -> httpx.Response | None:
    try:
        response = await client.get(path, timeout=5.0)
    except httpx.HTTPError:
        return None
    return response if response.status_code == 200 else None


def parse_metrics(text: str) -> dict[str, float]:
    """The ``llamacpp:*`` samples of a Prometheus text page that :data:`METRICS` names."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("llamacpp:"):
            continue
        name, _, value = line.partition(" ")
        key = name.removeprefix("llamacpp:").split("{", 1)[0]
        if key in METRICS:
            try:
                found[key] = float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return found


async def kv_cache_ratio(client: httpx.AsyncClient) -> float | None:
    """The server's KV-cache use (0 to 1); None when it does not answer or count it. A
    short timeout: a gateway's picker scrapes often, and a busy server is left out."""
    try:
        response = await client.get("/metrics", timeout=1.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse_metrics(response.text).get("kv_cache_usage_ratio")


def rss_mb(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss / 2**20)
    except psutil.Error:
        return None


async def server_report(client: httpx.AsyncClient, pid: int | None) -> dict[str, Any]:
    """Slots (total, busy, context per slot), the model file, the server's counters and the
    worker's resident memory (``footprint_mb``); parts the server does not answer are left
    out (a ``llama-cpp-python`` worker has none of these routes)."""
    props, slots, metrics = await asyncio.gather(
        _get(client, "/props"), _get(client, "/slots"), _get(client, "/metrics"))
    report: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if props is not None:
        data = props.json()
        server["total_slots"] = data.get("total_slots")
        server["ctx_per_slot"] = (data.get("default_generation_settings") or {}).get("n_ctx")
        server["model_path"] = data.get("model_path")
        server["build"] = data.get("build_info")
    if slots is not None:
        listed = slots.json()
        if isinstance(listed, list):
            server["busy_slots"] = sum(1 for s in listed if s.get("is_processing"))
    if server:
        report["server"] = server
    if metrics is not None:
        report["metrics"] = parse_metrics(metrics.text)
    footprint = rss_mb(pid)
    if footprint:
        report["footprint_mb"] = footprint
    return report
