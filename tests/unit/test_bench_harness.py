"""The benchmarks' rule: two sides compared differ only in what is measured, or the run stops."""

from __future__ import annotations

import pytest

from benchmarks.harness import BenchServer, demo_manifest, llama_flags, same_except
from tests.conftest import ServerProcess


@pytest.mark.parametrize(("argv", "flags"), [
    (["python", "-m", "workers.llama", "--model", "/m.gguf", "--port", "1", "--threads", "2"],
     {"--model": "/m.gguf", "--threads": "2"}),
    (["llama-server", "--ctx-size", "1024", "--cont-batching", "--parallel", "8"],
     {"--ctx-size": "1024", "--cont-batching": "on", "--parallel": "8"}),
    (["llama-server", "--alias", "x", "--metrics"], {}),
])
def test_llama_flags_reads_what_changes_a_figure(argv: list[str], flags: dict) -> None:
    assert llama_flags(argv) == flags


def test_sides_that_differ_only_in_what_is_measured_pass() -> None:
    same_except({"a": {"--threads": "2", "--port": "1"}, "b": {"--threads": "2", "--port": "9"}},
                measured=["--port"])


@pytest.mark.parametrize("b", [{"--threads": "1"}, {}])
def test_sides_that_differ_otherwise_stop_the_run(b: dict) -> None:
    with pytest.raises(SystemExit, match="--threads"):
        same_except({"direct": {"--threads": "2"}, "through": b})


def test_benchmarks_take_none_of_the_suites_tuning() -> None:
    assert ServerProcess.TUNING  # the suite has some ...
    assert BenchServer.TUNING == {}  # ... and a benchmark's coordinator none of it
    manifest = demo_manifest("m", threads=3, ctx_size=2048)
    assert (manifest["threads"], manifest["ctx_size"], manifest["parallel"]) == (3, 2048, 1)
