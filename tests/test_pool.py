"""Warm rank pools (HARNESS_STAGE_MODE=pool) against the fresh torchrun per stage,
on the cpu tier with the real stack: the same records, a failure stays in its stage and kills
only its pool, a timeout kills the pool in bounded time, and no pool process outlives a run."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from harness.launch.pool import PoolKey, PoolSet
from harness.launch.torchrun import run_stage
from harness.rank.spec import StageSpec
from harness.report.equivalence import differences
from tests.helpers import pool_key as key
from tests.helpers import pool_spec as spec
from harness.run.cells import run_cells, select_cells
from harness.scenario.scenarios import load_all
from tests.helpers import TEARDOWN_LIMIT_S, interrupt_a_hung_stage, pool_processes

pytestmark = pytest.mark.cpu  # the tests of the `saved` pool go together (conftest.py)

SAVE = "tp1-etp1-ep2-pp1"
CELLS = [f"cpu-reshard[save={SAVE},save-only]",
         f"cpu-reshard[save={SAVE},load=tp1-etp1-ep4-pp1]",
         f"cpu-reshard[save={SAVE},load=tp1-etp1-ep1-pp1-w2]",
         f"cpu-reshard[save={SAVE},load=tp1-etp1-ep1-pp2]"]


def same_records_and_reused_pools(tmp_path, monkeypatch, cell_ids: list[str], stages: int) -> None:
    """Fresh then pool mode over ``cell_ids``: equal records, fewer pool starts than stages."""
    cells = select_cells(load_all(), cell_ids)
    assert len(cells) == len(cell_ids)
    docs = {}
    for mode in ("fresh", "pool"):
        monkeypatch.setenv("HARNESS_STAGE_MODE", mode)
        docs[mode] = {c["cell_id"]: c for c in run_cells(cells, tmp_path / mode, mode, jobs=1)["cells"]}
    assert sorted(docs["fresh"]) == sorted(docs["pool"]) == sorted(cell_ids)
    for cid, fresh in docs["fresh"].items():
        assert fresh["outcome"] == "pass", (cid, fresh["message"])
    as_docs = {m: {"cells": list(d.values())} for m, d in docs.items()}
    assert differences(as_docs["fresh"], as_docs["pool"]) == []
    run_dir = next((tmp_path / "pool").iterdir())
    specs = [*run_dir.glob("saves/*/spec.json"), *run_dir.glob("cells/*/load/spec.json")]
    starts = list(run_dir.glob("pools/*/torchrun.log"))
    assert len(starts) < len(specs) == stages, (starts, specs)
    assert not list((tmp_path / "fresh").glob("*/pools")), "fresh mode started a pool"
    assert pool_processes(tmp_path) == []


def test_pool_mode_runs_a_save_and_its_load_on_one_warm_pool(tmp_path, monkeypatch):
    """`make test`'s pool-mode run (the GPU tiers' default stage mode): a save and a load of the
    same world size pass (scenarios/cpu_reshard.toml expects every cell to) on one pool, 2
    stages and 1 pool start, and no pool process outlives the run. The same cells against a
    fresh torchrun per stage: the test below (-m slow)."""
    cells = select_cells(load_all(), [CELLS[0], CELLS[2]])
    monkeypatch.setenv("HARNESS_STAGE_MODE", "pool")
    doc = run_cells(cells, tmp_path / "pool", "pool", jobs=1)
    got = {c["cell_id"]: (c["outcome"], c["stage_mode"], c["message"]) for c in doc["cells"]}
    assert {cid: v[:2] for cid, v in got.items()} == {CELLS[0]: ("pass", "pool"), CELLS[2]: ("pass", "pool")}, got
    run_dir = next((tmp_path / "pool").iterdir())
    assert len(list(run_dir.glob("pools/*/torchrun.log"))) == 1
    assert pool_processes(tmp_path) == []


@pytest.mark.slow  # pool against fresh: the pool's own run is the test above
def test_pool_mode_gives_the_same_records_and_reuses_a_pool(tmp_path, monkeypatch):
    """A save and a load of the same world size, so the load runs on the save's warm pool (2
    stages, 1 pool start), with the same records as a fresh torchrun per stage."""
    same_records_and_reused_pools(tmp_path, monkeypatch, [CELLS[0], CELLS[2]], stages=2)


@pytest.mark.slow
def test_pool_mode_gives_the_same_records_and_reuses_pools(tmp_path, monkeypatch):
    """The save, its save-only cell and loads at 4, 2 and 2 (pp2) ranks."""
    same_records_and_reused_pools(tmp_path, monkeypatch, CELLS, stages=4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 2-rank checkpoint saved on a pool; the pool set is closed (and checked) at the end."""
    root = tmp_path_factory.mktemp("pool")
    pools = PoolSet()
    s = spec(root, "save", SAVE)
    run = pools.run(key(root, 2), s.write(root / "save" / "spec.json"), "save", root / "save", 240)
    assert run.ok, run.summary()
    yield root, pools
    pools.close_all()
    assert pool_processes(root) == []


def load(root: Path, pools: PoolSet, name: str, topo: str, timeout_s: float = 240, inject=None):
    s = spec(root, "load", topo)
    path = s.write(root / name / "spec.json")
    return pools.run(key(root, 2), path, "load", root / name, timeout_s,
                     job_env={"HARNESS_INJECT": inject})


def pool_dir(root: Path, n: int) -> Path:
    """The n-th pool the set started (the one a stage just ran on, when n = started)."""
    return root / "pools" / f"w2-cpu-none-{n}"


@pytest.mark.slow  # a failed pool stage: the timeout below kills and replaces a pool the same way
def test_a_failure_names_the_same_cause_and_the_next_stage_gets_a_new_pool(saved):
    root, pools = saved
    warm = load(root, pools, "warm", "tp1-etp1-ep1-pp1-w2")  # a warm pool, whatever ran before
    assert warm.ok, warm.summary()
    started = pools.started
    failed = load(root, pools, "fails", "tp1-etp1-ep1-pp1-w2", inject="raise:1:before_load")
    s = spec(root, "load", "tp1-etp1-ep1-pp1-w2")
    fresh = run_stage("load", root / "fresh", 2, [str(s.write(root / "fresh" / "spec.json"))],
                      240, env={"HARNESS_INJECT": "raise:1:before_load"})
    for r in (failed, fresh):
        assert not r.ok and not r.timed_out and r.leftovers == [], r.summary()
        assert (r.cause.rank, r.cause.kind, r.cause.exc_type) == (1, "exception", "RuntimeError"), \
            r.summary()
        assert all(x.secondary for x in r.secondaries), r.summary()
    assert failed.result().cause == fresh.result().cause
    assert (root / "fails" / "torchrun.log").exists() and (root / "fails" / "errors" / "rank1.json").exists()
    assert pool_processes(pool_dir(root, started)) == [], "the failed pool left a process"
    after = load(root, pools, "after", "tp1-etp1-ep1-pp2")
    assert after.ok, after.summary()
    assert pools.started == started + 1, "the failed pool was not replaced"


@pytest.mark.slow  # pool mode; make test's stage timeout is fork mode's (tests/test_teardown.py)
def test_a_timeout_kills_the_pool_in_bounded_time(saved):
    root, pools = saved
    warm = load(root, pools, "warm2", "tp1-etp1-ep1-pp1-w2")
    assert warm.ok, warm.summary()
    started = pools.started
    # the warm pool's rank 1 reaches the hang about 0.4 s after the job is handed out (its
    # imports are done; docs/benchmarks.md, "The heaviest `make test` tests"): 8 s is the wait
    # for the timeout, 20 times that, not 15 s of a test's wall spent waiting
    limit = 8.0
    t = time.time()
    r = load(root, pools, "hangs", "tp1-etp1-ep1-pp1-w2", timeout_s=limit, inject="hang:1:before_load")
    assert r.timed_out and r.leftovers == [], r.summary()
    assert (r.cause.rank, r.cause.kind) == (1, "timeout"), r.summary()
    assert time.time() - t < limit + 10, r.summary()
    assert "inject.py" in (root / "hangs" / "stacks" / "rank1.txt").read_text()
    assert pool_processes(pool_dir(root, started)) == []
    again = load(root, pools, "again", "tp1-etp1-ep1-pp2")
    assert again.ok and pools.started == started + 1, again.summary()


@pytest.mark.slow  # pool mode: the signal path in fork mode is tests/test_interrupts.py's
@pytest.mark.parametrize("sig", [signal.SIGINT])
def test_an_interrupt_tears_the_pool_down(tmp_path, monkeypatch, sig):
    """The CLI in pool mode, every rank hung: the signal ends the run in bounded time, the
    cell is ``interrupted`` and no pool process is left (tests/test_interrupts.py, fresh mode)."""
    monkeypatch.setenv("HARNESS_STAGE_MODE", "pool")
    proc, out, gone_s = interrupt_a_hung_stage(tmp_path, sig)
    assert proc.returncode == 128 + sig, out
    assert gone_s < TEARDOWN_LIMIT_S, f"{gone_s:.1f} s from {sig.name} to exit\n{out}"
    assert pool_processes(tmp_path) == [], "pool ranks outlived the controller"
    assert list(tmp_path.glob("*-interrupt/pools/*/torchrun.log")), "no pool ran"
    (cell,) = json.loads(next(tmp_path.glob("*-interrupt/results.json")).read_text())["cells"]
    assert cell["outcome"] == "interrupted" and cell["failed_stage"] == "save", cell


def test_pool_mode_groups_each_phase_by_world_size(monkeypatch):
    """So each stage finds the pool the previous one left idle; fresh mode keeps file order."""
    from harness.run import cells as cells_mod
    from harness.run.cells import _phase_order
    from harness.scenario.scenarios import load_all

    # no idle pools: earlier tests of this worker (cells run in pool mode) may have left some
    monkeypatch.setattr(cells_mod, "POOLS", PoolSet())

    loads = [c for s in load_all() if s.name == "cpu-reshard" for c in s.cells() if c.load]
    assert len({c.load.world_size for c in loads}) > 1
    monkeypatch.setenv("HARNESS_STAGE_MODE", "fresh")
    assert _phase_order(loads, "load") == loads
    monkeypatch.setenv("HARNESS_STAGE_MODE", "pool")
    worlds = [c.load.world_size for c in _phase_order(loads, "load")]
    assert worlds == sorted(worlds)


def test_an_unknown_stage_mode_is_one_line_before_any_stage(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.setenv("HARNESS_STAGE_MODE", "bogus")
    rc = main(["--results-root", str(tmp_path), "run", "--scenario", "cpu-reshard"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1] == "error: HARNESS_STAGE_MODE='bogus': want one of ('fresh', 'pool', 'fork')", err
    assert not list(tmp_path.iterdir()), "a run directory was made"
