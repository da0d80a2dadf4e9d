"""The nightly GPU job's path, rehearsed on the cpu tier in every `make test`.

`make test-gpu` runs scenario cells under pytest-xdist with ``--dist loadgroup``: every worker
shares the controller's run directory, each save's cells go to one worker, and each worker
keeps warm rank pools there. On one GPU host that path once passed saves that never ran (two
workers on one pool directory; a save "ok" with 0 ranks and no checkpoint, its loads failing,
a witness judged unexpected-pass). Here the same command shape runs cells that need no GPU:
two saves of the same world size on two workers at once (save-only cells: the load path is
the same pool path, and each further stage costs `make test` about 15 s).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from harness.paths import REPO_ROOT
from tests.helpers import bounded, pool_processes

pytestmark = pytest.mark.cpu

SCENARIO = """name = "cpu-nightly-rehearsal"
description = "Two saves of world 2 on two xdist workers sharing one run directory."
tier = "cpu"
backend = "local"
patch = "none"
expect = "pass"
markers = ["cpu"]
saves = ["tp1-etp1-ep2", "tp1-etp1-ep1-pp1-w2"]
loads = []
"""
SAVES = ("tp1-etp1-ep2-pp1", "tp1-etp1-ep1-pp1-w2")


@pytest.mark.slow  # a pytest of pytest: the pool path is in tests/test_pool.py, the shared run dir in test_cells
def test_two_xdist_workers_run_their_saves_on_their_own_pools(tmp_path):
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "rehearsal.toml").write_text(SCENARIO)
    env = {**os.environ, "HARNESS_SCENARIO_DIR": str(scenarios), "HARNESS_STAGE_MODE": "pool"}
    env.pop("PYTEST_ADDOPTS", None)
    r = bounded([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "cpu", "-n", "2",
                 "--dist", "loadgroup", "-q", "--results-root", str(tmp_path / "results"),
                 "tests/test_cells.py"], 600, cwd=REPO_ROOT, env=env)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = (tmp_path / "results").iterdir()
    cells = json.loads((run / "results.json").read_text())["cells"]
    assert len(cells) == 2 and {c["outcome"] for c in cells} == {"pass"}
    for c in cells:  # every save ran on both of its ranks, at its own topology
        assert c["evidence"]["save"]["ranks"] == 2, c["cell_id"]
        assert c["evidence"]["save"]["topologies"] == [c["save_topology"]], c["cell_id"]
    for save in SAVES:
        stage = json.loads((run / "saves" / f"cpu-local-none-{save}" / "stage.json").read_text())
        assert stage["ok"] and sorted(stage["rank_results"]) == ["0", "1"], stage["summary"]
    workers = {p.name.split("-p")[1].split("-")[0] for p in (run / "pools").iterdir()}
    assert len(workers) == 2, f"both saves ran in one worker, the rehearsal proved nothing: {workers}"
    assert pool_processes(tmp_path) == []
