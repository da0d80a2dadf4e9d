"""Stage mode fork without a stage: what the warm parent says about itself, and the
lines its stage agents write that the watcher reads. The stages themselves: tests/test_teardown.py
(every failure kind in both modes), tests/test_interrupts.py, tests/test_pool_prestart.py."""
from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from harness.launch import failures as F
from harness.rank import warm
from harness.tiers import TABLE, Tier

pytestmark = pytest.mark.cpu


def test_the_warm_parent_names_the_import_that_makes_it_unforkable(tmp_path, monkeypatch):
    """A tier whose preload list holds a module that starts a thread at import: the parent's
    ready.json names that module, and stops importing there."""
    if threading.active_count() > 1:
        pytest.skip("this pytest process runs other threads already")
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading\nstop = threading.Event()\nthreading.Thread(target=stop.wait, daemon=True).start()\n")
    (tmp_path / "never_imported.py").write_text("raise AssertionError('imported after the refusal')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(TABLE, Tier.GPU, dataclasses.replace(
        TABLE[Tier.GPU], fork_preload=("json", "starts_a_thread", "never_imported")))
    try:
        ready = warm.preload("gpu", "none")
    finally:
        import starts_a_thread

        starts_a_thread.stop.set()
    assert ready["preload_failed"] is None
    assert ready["refuses_fork"].startswith("after importing starts_a_thread: Python threads"), ready


def test_the_warm_parent_refuses_a_preload_that_poisons_forks(tmp_path, monkeypatch):
    """torch's bad-fork state without CUDA initialized (the GPU host's preload, 2026-12-06: every
    forked rank raised 'Cannot re-initialize CUDA in forked subprocess'): a forked probe child
    sees it, and ready.json names the import after which it holds."""
    import torch

    if threading.active_count() > 1:
        pytest.skip("this pytest process runs other threads already")
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", torch.cuda._is_in_bad_fork)  # restored after
    (tmp_path / "poisons_forks.py").write_text(
        "import torch\ntorch.cuda._is_in_bad_fork = lambda: True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(TABLE, Tier.GPU, dataclasses.replace(
        TABLE[Tier.GPU], fork_preload=("torch", "poisons_forks")))
    assert warm.child_in_bad_fork() is False
    ready = warm.preload("gpu", "none")
    assert ready["refuses_fork"].startswith(
        "after importing poisons_forks: a forked child is in torch's bad-fork state"), ready


def test_a_refusing_parents_stages_start_fresh_torchrun(monkeypatch, tmp_path, capsys):
    """HARNESS_STAGE_MODE=fork where the parent refuses: each stage runs as fresh torchrun would
    (the same run_stage call), the refusal printed once, not a failed stage."""
    from pathlib import Path

    from harness.launch import warm as launch_warm

    class Refusing:
        dir, ready = tmp_path / "fork-gpu-none-1", {"refuses_fork": "poisoned"}

        def refusal(self, wait_s):
            return "poisoned"

        def run(self, *a, **kw):
            raise AssertionError("a refusing parent was handed a stage")

    calls = []
    parents = launch_warm.WarmParents()
    monkeypatch.setattr(parents, "get", lambda key: Refusing())
    monkeypatch.setattr(launch_warm, "run_stage", lambda *a, **kw: calls.append((a, kw)) or "fresh")
    for _ in range(2):
        assert parents.run("key", "save", Path(tmp_path / "s"), 2, ["spec.json"], 60.0, {"A": "1"},
                           grace_s=1.0) == "fresh"
    assert calls[0] == (("save", tmp_path / "s", 2, ["spec.json"], 60.0, {"A": "1"}), {"grace_s": 1.0})
    assert capsys.readouterr().err.count("poisoned; its stages start fresh torchrun") == 1


def test_the_agents_exit_blocks_and_close_lines_read_as_torchruns():
    """report_exits' block and torch's two wordings for signalling a forked rank."""
    text = ("[warm] rank exit seen by the stage agent:\n[3]:\n  rank      : 3 (local_rank: 3)\n"
            "  exitcode  : -9 (pid: 4242)\n"
            "W1206 api.py:900] Closing process 4243 via signal SIGTERM\n"
            "W1206 spawn.py:165] Terminating process 4244 via signal SIGTERM\n"
            "W1206 api.py:900] Sending process 4245 closing signal SIGTERM\n")
    assert F.parse_elastic_failures(text) == {3: (-9, 4242)}
    assert F.parse_elastic_signalled(text) == {4243, 4244, 4245}


def test_make_repro_starts_the_grids_warm_parent_before_its_probe(monkeypatch, tmp_path):
    """The cpu grid's cells (fork mode) share one parent key: one parent started ahead, none for
    a tier that does not fork (the GPU cells run in pools)."""
    from harness.paths import RunDir
    from harness.run import cells as run_cells_module
    from harness.run.repro import CPU_REPRO_CELLS, GPU_REPRO_CELLS
    from harness.scenario.scenarios import load_all

    started = []
    monkeypatch.setattr(run_cells_module.WARM, "get", lambda key: started.append(key))
    run = RunDir.new(tmp_path, "repro-cpu")
    scenarios = load_all()
    cpu = run_cells_module.select_cells(scenarios, CPU_REPRO_CELLS)
    assert run_cells_module.prestart_warm_parents(cpu, run) == 1 and len(started) == 1
    assert started[0].tier == Tier.CPU and started[0].root == str(run.root)
    gpu = run_cells_module.select_cells(scenarios, GPU_REPRO_CELLS)
    assert run_cells_module.prestart_warm_parents(gpu, run) == 0 and len(started) == 1


def test_a_kept_parent_serves_every_run_of_its_key_and_outlives_their_ends(tmp_path, monkeypatch):
    """keep_across_runs (a pytest worker, conftest.py): runs in two roots get one parent, in the
    kept directory, which end_run leaves alive; a variable outside the pool key's prefixes makes
    another; without it each run's parent lives in its run and end_run closes it."""
    from harness.launch import warm as launch_warm

    class Proc:
        pid = 0

        def poll(self):
            return None

    closed = []
    monkeypatch.setattr(launch_warm.WarmParent, "start", lambda self: setattr(self, "proc", Proc()) or self)
    monkeypatch.setattr(launch_warm.WarmParent, "close", lambda self: closed.append(self))
    parents = launch_warm.WarmParents()
    parents.keep_across_runs(tmp_path / "kept")
    first = parents.get(launch_warm.parent_key("cpu", "none", "local", tmp_path / "run1"))
    parents.end_run()
    assert parents.get(launch_warm.parent_key("cpu", "none", "local", tmp_path / "run2")) is first
    assert first.dir.parent == (tmp_path / "kept" / "pools").resolve() and closed == []
    monkeypatch.setenv("PYTORCH_SOMETHING_READ_AT_IMPORT", "1")
    other = parents.get(launch_warm.parent_key("cpu", "none", "local", tmp_path / "run2"))
    assert other is not first and parents.kept() and set(parents.kept()) == {first, other}
    parents.keep_across_runs(None)
    own = parents.get(launch_warm.parent_key("cpu", "none", "local", tmp_path / "run3"))
    assert own.dir.parent == (tmp_path / "run3" / "pools").resolve()
    parents.end_run()
    assert closed == [own]
    parents.close_all()
    assert set(closed) == {own, first, other} and parents.kept() == []


def agent_job(stage_dir) -> dict:
    """A stage agent's job file, as harness/launch/warm.py writes it (no rank is started here)."""
    return {"stage_dir": str(stage_dir), "nproc": 2, "rdzv_endpoint": "127.0.0.1:1",
            "rank_module": "harness.rank", "rank_args": []}


def test_the_stage_agent_asks_for_cuda_through_nvml_and_its_ranks_keep_the_stage_env(
        tmp_path, monkeypatch):
    """torch's LaunchConfig asks torch.cuda.is_available() for its NUMA defaults. The stage
    agent's environment is the stage's, without the parent's PYTORCH_NVML_BASED_CUDA_CHECK: asked
    through the CUDA runtime, that poisoned every fork on the H100 host (2026-12-07, all 8 ranks
    of each stage: 'Cannot re-initialize CUDA in forked subprocess'). The agent asks through
    NVML, and the ranks it starts see the stage's environment, as under a fresh torchrun."""
    import torch
    from torch.distributed import launcher

    asked, launched = [], []
    monkeypatch.delenv(warm.NVML_CHECK, raising=False)

    def is_available():
        asked.append(os.environ.get(warm.NVML_CHECK))
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)

    def fake_launch(config, entry):
        return lambda *args: launched.append(os.environ.get(warm.NVML_CHECK))

    monkeypatch.setattr(launcher.api, "elastic_launch", fake_launch)
    monkeypatch.setattr(warm, "cuda_compiled", lambda: False)
    assert warm.launch(agent_job(tmp_path)) == 0
    assert asked == ["1"], "LaunchConfig asked the CUDA runtime"
    assert launched == [None], "the ranks' environment kept the agent's NVML setting"


def test_a_stage_agent_that_poisoned_its_forks_fails_before_forking_ranks(tmp_path, monkeypatch):
    """Should anything else in the agent touch the CUDA runtime, its stage fails with that said,
    not with one 'Cannot re-initialize CUDA' per rank."""
    from torch.distributed import launcher

    monkeypatch.setattr(launcher.api, "elastic_launch", lambda *a: pytest.fail("ranks forked"))
    monkeypatch.setattr(warm, "cuda_compiled", lambda: True)
    monkeypatch.setattr(warm, "child_in_bad_fork", lambda: True)
    with pytest.raises(RuntimeError, match="touched the CUDA runtime before forking its ranks"):
        warm.launch(agent_job(tmp_path))


FORKED_WHILE_THE_THREAD_IMPORTS = """
import importlib.abc, os, sys, threading, time
from pathlib import Path

class Descheduled(importlib.abc.MetaPathFinder):
    '''guard's import takes 2 s, wherever it happens: a thread on a loaded machine.'''
    def find_spec(self, name, path, target=None):
        if name == "harness.rank.guard":
            time.sleep(2.0)
        return None

sys.meta_path.insert(0, Descheduled())
from harness.rank import warm
threading.Thread(target=warm.report_exits, args=(Path(sys.argv[1]),), daemon=True).start()
time.sleep(0.3)
pid = os.fork()
if pid == 0:  # a rank, forked while the agent's thread runs: its own import of guard
    from harness.rank import guard
    os._exit(0)
deadline = time.time() + 10
while os.waitpid(pid, os.WNOHANG)[0] == 0:
    if time.time() > deadline:
        os.kill(pid, 9)
        sys.exit("the forked rank hung at its import of harness.rank.guard")
    time.sleep(0.05)
"""


def test_a_rank_forked_while_the_agents_thread_runs_does_not_hang_at_its_imports(tmp_path):
    """The stage agent watches its ranks' exits from a thread while it forks them. A rank
    forked while that thread held a module's import lock (the thread importing it) hangs for
    ever at its own import of that module: CI, 2026-12-07, a 2-rank stage timed out after 60 s.
    Here that import is made slow; the thread must not be the one doing it."""
    import sys

    from harness.paths import REPO_ROOT
    from tests.helpers import bounded

    done = bounded([sys.executable, "-c", FORKED_WHILE_THE_THREAD_IMPORTS, str(tmp_path)], 60,
                   cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
