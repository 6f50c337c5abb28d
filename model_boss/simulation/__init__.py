"""Simulation: trace replay over the coordinator's own scheduling code (ordering, planner,
eviction), side-by-side comparisons, traces, and the ``model-boss simulate`` command. It
imports only :mod:`model_boss.scheduling` and plain data, never what runs workers."""
