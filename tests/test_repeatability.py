"""Three runs of the cpu-tier grid give identical records: same outcome, exception,
failing key and verify figures; only measurements (times, memory) may differ. The rule is the
equivalence check's (harness/report/equivalence.py), so a field added to the records is judged
once. Slow (about 3 x the grid): not in CI."""
from __future__ import annotations

import io

import pytest

from harness.report.equivalence import differences
from harness.run.cells import run_cells, select_cells
from harness.scenario.scenarios import load_all

pytestmark = [pytest.mark.cpu, pytest.mark.slow]


def test_three_cpu_grid_runs_give_identical_records(tmp_path):
    cells = select_cells([s for s in load_all() if s.name == "cpu-reshard"])
    runs = [run_cells(cells, tmp_path, f"repeat{i}", jobs=1, out=io.StringIO()) for i in range(3)]
    assert len(runs[0]["cells"]) == len(cells)
    for i in (1, 2):
        assert differences(runs[0], runs[i]) == [], f"run {i} differs from run 0"
