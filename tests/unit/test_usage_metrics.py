"""Metrics.observe_usage: the ledger's figures as Prometheus counters by key name."""

from __future__ import annotations

from model_boss.observability.metrics import Metrics
from model_boss.tenancy.usage import UsageRow


def test_usage_counters_by_key() -> None:
    metrics = Metrics()
    metrics.observe_usage(UsageRow(key="", end_user="u", model="m", endpoint="chat",
                                   outcome="ok", http_status=200, prompt_tokens=10,
                                   completion_tokens=4, gpu_seconds=0.5))
    metrics.observe_usage(UsageRow(key="team-a", end_user="", model="sd", endpoint="images",
                                   outcome="failed", http_status=502, images=2,
                                   audio_seconds=1.5))
    text = metrics.render().decode()
    assert 'model_boss_usage_requests_total{key="-",model="m",outcome="ok"} 1.0' in text
    assert 'model_boss_usage_tokens_total{direction="prompt",key="-",model="m"} 10.0' in text
    assert 'model_boss_usage_tokens_total{direction="completion",key="-",model="m"} 4.0' in text
    assert 'direction="cached"' not in text  # a zero adds no series
    assert 'model_boss_usage_gpu_seconds_total{key="-",model="m"} 0.5' in text
    assert 'model_boss_usage_requests_total{key="team-a",model="sd",outcome="failed"} 1.0' \
        in text
    assert 'model_boss_usage_images_total{key="team-a",model="sd"} 2.0' in text
    assert 'model_boss_usage_audio_seconds_total{key="team-a",model="sd"} 1.5' in text
