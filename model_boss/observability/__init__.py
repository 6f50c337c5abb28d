"""What the daemon shows of itself: the Prometheus metrics, the inference-gateway gauges, the
history (the last hour's timeline and the last finished requests)."""
