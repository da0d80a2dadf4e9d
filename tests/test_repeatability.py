"""Three runs of the cpu-tier grid give identical records (issue 15): same outcome, exception,
failing key and verify figures; only times may differ. Slow (about 3 x the grid): not in CI."""
from __future__ import annotations

import io

import pytest

from harness.run.cells import run_cells, select_cells
from harness.scenario.scenarios import load_all

pytestmark = [pytest.mark.cpu, pytest.mark.slow]
TIMES = ("durations", "teardown_s")


def _records(doc: dict) -> dict[str, dict]:
    return {c["cell_id"]: {k: v for k, v in c.items() if k not in TIMES} for c in doc["cells"]}


def test_three_cpu_grid_runs_give_identical_records(tmp_path):
    cells = select_cells([s for s in load_all() if s.name == "cpu-reshard"])
    runs = [_records(run_cells(cells, tmp_path, f"repeat{i}", jobs=1, out=io.StringIO()))
            for i in range(3)]
    assert len(runs[0]) == len(cells)
    for i in (1, 2):
        differ = {cid: (runs[0][cid], rec) for cid, rec in runs[i].items() if rec != runs[0][cid]}
        assert not differ, f"run {i} differs from run 0: {differ}"
