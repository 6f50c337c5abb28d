"""In which order, in which pieces and on which test process the suite's files run.

``scripts/test.sh`` runs the suite with ``--dist loadfile``: xdist hands each test process a
file at a time, in collection order (``--no-loadscope-reorder``). Three things keep both cores
busy to the end:

- **Longest first** (``LONGEST_FIRST``, the end-to-end files by their wall clock in a run
  on two cores, the shortest last): neither process is left with a long file at the end
  while the other idles (xdist's own order, by test count, put the 40-second fuzz test, one
  test, last). The two diffusion files each load torch in several workers: side by side they
  took 130 s of the two processes' time, apart 85 s, so they are spread.
- **The quiet files as one piece** (``piece``): the unit and integration files (but the fuzz
  test) spend most of their time waiting on timers (lease expiries, heartbeats, time-outs):
  84 s of wall clock for 31 s of CPU in one run. Run last, they left both cores more than
  half idle for the final minute. A few end-to-end files wait as much (Redis restarts,
  stand-in upstreams, command workers that sleep: 47 s for 26 s of CPU) and join them.
- **A process of their own** (``--quiet-process``, which ``scripts/test.sh`` passes with one
  process more than ``MODEL_BOSS_TEST_WORKERS``): one test process runs the quiet piece and
  nothing else, beside the others' end-to-end files, so its waits overlap their work; the
  others never take it. Without the flag it is a piece like the others.
"""

from __future__ import annotations

LONGEST_FIRST = ("e2e/test_agents.py", "e2e/test_transformers_worker.py",
                 "unit/test_fuzz_api.py", "quiet",
                 "e2e/test_diffusion.py", "e2e/test_diffusers_worker.py",
                 "e2e/test_diffusers_lora_worker.py", "e2e/test_videos.py",
                 "e2e/test_dashboard_jobs.py", "e2e/test_llama_adapters.py",
                 "e2e/test_adapters.py", "e2e/test_image_edits.py",
                 "e2e/test_video_worker.py", "e2e/test_reference_worker.py",
                 "e2e/test_spare_worker.py", "e2e/test_stress.py", "e2e/test_replicas.py",
                 "e2e/test_cluster_e2e.py", "e2e/test_cluster_prefix_e2e.py",
                 "e2e/test_usage_ledger_e2e.py", "e2e/test_llama_eviction.py",
                 "e2e/test_dashboard.py",
                 "e2e/test_dashboard_traffic.py", "e2e/test_dashboard_replicas.py",
                 "e2e/test_openai_fidelity.py",
                 "e2e/test_ollama_api.py", "e2e/test_scheduling_e2e.py",
                 "e2e/test_prompt_cache.py", "e2e/test_transformers_discovery.py",
                 "e2e/test_llama_parity.py", "e2e/test_worker_kills.py",
                 "e2e/test_llama_workers.py", "e2e/test_live_catalog.py",
                 "e2e/test_llama_chat.py", "e2e/test_pull.py", "e2e/test_clients.py",
                 "e2e/test_router_e2e.py", "e2e/test_soak.py", "e2e/test_placement.py",
                 "e2e/test_orphans.py", "e2e/test_shutdown.py", "e2e/test_anthropic_api.py",
                 "e2e/test_load_progress_e2e.py", "e2e/test_config_errors.py")
QUIET = ("unit/", "integration/", "e2e/test_redis_e2e.py", "e2e/test_redis_restart_e2e.py",
         "e2e/test_cloud_backend.py", "e2e/test_command_backend.py")
NOT_QUIET = ("unit/test_fuzz_api.py",)  # 30 s of one core: a piece of its own
QUIET_PIECE = "quiet"


def piece(nodeid: str) -> str:
    """The file a test is in, or ``quiet`` for the files that mostly wait."""
    path = nodeid.split("::", 1)[0]
    name = path.removeprefix("tests/")
    return QUIET_PIECE if name.startswith(QUIET) and name not in NOT_QUIET else path


def file_rank(item) -> int:
    name = piece(item.nodeid).removeprefix("tests/")
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


class QuietPiece:
    """A pytest plugin (registered when xdist is): ``--dist loadfile`` by pieces, the quiet
    piece on a process of its own with ``--quiet-process``."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadfile":
            return None
        own_process = config.getoption("quiet_process")
        from xdist.scheduler import LoadFileScheduling

        class Pieces(LoadFileScheduling):
            quiet_node = None  # the process that runs the quiet piece alone, once chosen

            def _split_scope(self, nodeid: str) -> str:
                return piece(nodeid)

            def schedule(self) -> None:
                if self.collection is None and own_process and len(self.nodes) >= 2:
                    self.quiet_node = max(self.nodes, key=lambda node: node.gateway.id)
                super().schedule()

            def _next_for(self, node) -> str | None:
                # a quiet process that crashed, or was let go for want of work, is no more
                quiet = self.quiet_node if self.quiet_node in self.assigned_work else None
                if node is quiet:
                    return QUIET_PIECE if QUIET_PIECE in self.workqueue else None
                if quiet is None:
                    return next(iter(self.workqueue), None)
                return next((name for name in self.workqueue if name != QUIET_PIECE), None)

            def _assign_work_unit(self, node) -> None:
                name = self._next_for(node)
                if name is not None:
                    self.workqueue.move_to_end(name, last=False)
                    super()._assign_work_unit(node)

            def _reschedule(self, node) -> None:
                if node.shutting_down:
                    return
                if self._next_for(node) is None:
                    node.shutdown()  # it finishes what it has, then exits
                    return
                if self._pending_of(self.assigned_work[node]) <= 2:
                    self._assign_work_unit(node)

        return Pieces(config, log)
