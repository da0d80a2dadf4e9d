"""harness.matrix: argument handling and table rendering only (no environment is built in CI)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness import matrix as M

pytestmark = pytest.mark.cpu


def test_versions_default_order_and_dedup():
    assert M.versions_from(SimpleNamespace(modelopt=[])) == ["0.46.1", "0.47.0"]
    assert M.versions_from(SimpleNamespace(modelopt=["0.47.0", "0.46.1", "0.47.0"])) == ["0.47.0", "0.46.1"]
    assert M.versions_from(SimpleNamespace(modelopt=["a1b2c3d"])) == ["a1b2c3d"]  # git ref (docker)


def test_bad_version_exits_2_without_building(capsys, tmp_path):
    args = SimpleNamespace(modelopt=["0.47.0; rm -rf /"], results_root=str(tmp_path))
    assert M.main(args) == 2
    assert "not a version or git ref" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_cli_wires_matrix(monkeypatch):
    from harness import cli

    seen = {}
    monkeypatch.setattr(M, "main", lambda a: seen.setdefault("args", a) and 0)
    cli.main(["--results-root", "r", "matrix", "--modelopt", "0.46.1"])
    assert seen["args"].modelopt == ["0.46.1"] and seen["args"].results_root == "r"


def test_cells_from_results_counts_outcomes_and_tiers():
    reason = "tier gpu-shared needs a CUDA GPU; none visible (run the cpu tier here)"
    doc = {"cells": [
        {"scenario": "gpu-witness", "tier": "gpu-shared", "outcome": "skipped", "reason": reason},
        {"scenario": "gpu-witness", "tier": "gpu-shared", "outcome": "skipped", "reason": reason},
        {"scenario": "cpu-reshard", "tier": "cpu", "outcome": "pass", "reason": None},
        {"scenario": "cpu-reshard", "tier": "cpu", "outcome": "unexpected-failure", "reason": None},
    ]}
    cells = M.cells_from_results(doc)
    assert cells["gpu-witness"].text() == "2 skipped [gpu-shared] (tier gpu-shared needs a CUDA GPU)"
    assert cells["cpu-reshard"].text() == "1 pass, 1 unexpected-failure [cpu]"


def test_pytest_summary_parsing():
    c = M.cell_from_pytest(0, "....\n2 passed, 1 skipped in 12.3s\n")
    assert c.counts == {"passed": 2, "skipped": 1} and c.tiers == ["cpu"]
    assert "no summary" in M.cell_from_pytest(4, "ERROR: usage").text()


def test_render_table_one_row_per_version():
    rows = {"0.46.1": {"import": M.Cell({"pass": 1}, ["cpu"])},
            "0.47.0": {"import": M.Cell(note="no env: timed out")}}
    lines = M.render_table(rows).splitlines()
    assert lines[0] == "| modelopt | import | gpu-witness | gpu-fix | cpu-reshard | oracle |"
    assert lines[2] == "| 0.46.1 | 1 pass [cpu] | - | - | - | - |"
    assert lines[3].startswith("| 0.47.0 | no env: timed out | -")


def test_run_kills_on_timeout(tmp_path):
    rc, _ = M._run(["bash", "-c", "sleep 30"], 0.5, tmp_path / "x.log")
    assert rc is None
