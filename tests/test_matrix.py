"""harness.run.matrix: argument handling, and harness/report/matrix_table.py: table rendering
(no environment is built in CI)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.report import matrix_table as T
from harness.run import matrix as M

pytestmark = pytest.mark.cpu


def test_versions_default_order_and_dedup():
    assert M.versions_from(SimpleNamespace(modelopt=[])) == ["0.46.1", "0.47.0", "0.48.0rc1"]
    assert M.versions_from(SimpleNamespace(modelopt=["0.47.0", "0.46.1", "0.47.0"])) == ["0.47.0", "0.46.1"]
    assert M.versions_from(SimpleNamespace(modelopt=["git:a1b2c3d"])) == ["git:a1b2c3d"]  # docker


def test_local_wheel_must_exist(tmp_path):
    wheel = tmp_path / "nvidia_modelopt-0.48.0rc1-py3-none-any.whl"
    with pytest.raises(ValueError, match="no such wheel file"):
        M.versions_from(SimpleNamespace(modelopt=[str(wheel)]))
    wheel.write_bytes(b"")
    assert M.versions_from(SimpleNamespace(modelopt=[str(wheel)])) == [str(wheel)]


def test_bad_version_exits_2_without_building(capsys, tmp_path):
    args = SimpleNamespace(modelopt=["0.47.0; rm -rf /"], results_root=str(tmp_path))
    assert M.main(args) == 2
    assert "not a version, a wheel file or git:<ref>" in capsys.readouterr().err
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
    cells = T.cells_from_results(doc)
    assert cells["witness"].text() == "2 skipped [gpu-shared] (tier gpu-shared needs a CUDA GPU)"
    assert cells["cpu-reshard"].text() == "1 pass, 1 unexpected-failure [cpu]"


def test_pytest_summary_parsing():
    c = M.cell_from_pytest(0, "....\n2 passed, 1 skipped in 12.3s\n")
    assert c.counts == {"passed": 2, "skipped": 1} and c.tiers == ["cpu"]
    assert "no summary" in M.cell_from_pytest(4, "ERROR: usage").text()


def test_render_table_one_row_per_version():
    rows = {"0.46.1": {"import": T.TableEntry({"pass": 1}, ["cpu"])},
            "0.47.0": {"import": T.TableEntry(note="no env: timed out")}}
    lines = T.render_table(rows).splitlines()
    assert lines[0] == ("| modelopt + megatron-core | import | witness | second-bug | fix | goldens | cpu-reshard "
                        "| oracle |")
    assert lines[2] == "| 0.46.1 | 1 pass [cpu] | - | - | - | - | - | - |"
    assert lines[3].startswith("| 0.47.0 | no env: timed out | -")


def test_run_kills_on_timeout(tmp_path):
    rc, _ = M._run(["bash", "-c", "sleep 30"], 0.5, tmp_path / "x.log")
    assert rc is None


def _rec(scenario, load, expected, **kw):
    return {"scenario": scenario, "tier": "gpu-shared", "outcome": "pass", "reason": None,
            "load_topology": load, "expected": expected, "cell_id": f"{scenario}[x]", **kw}


def test_second_bug_column_holds_witness_loads_with_several_experts_per_rank():
    amax = {"saved": 32, "restored": 4, "absent": 28, "placeholder-zero": 0, "differs": 0}
    doc = {"cells": [
        _rec("gpu-witness", "tp1-etp1-ep1-pp1", "amax-lost", outcome="bug-reproduced",
             verify={"expert_amax_state": amax}),
        _rec("gpu-witness", "tp4-etp1-ep8-pp1", "fail-load"),  # one expert per rank
        _rec("gpu-witness", None, "fail-save"),
    ]}
    cells = T.cells_from_results(doc)
    assert cells["second-bug"].counts == {"bug-reproduced": 1}
    assert cells["second-bug"].note == "expert amax lost per load: 28/32"
    assert cells["witness"].counts == {"pass": 2}


def test_goldens_table_says_what_the_model_holds():
    verify = {"expert_amax_state": {"saved": 32, "restored": 16, "placeholder-zero": 16,
                                    "absent": 0, "differs": 0},
              "logits_effect": {"nonfinite_loaded": 7, "logits": 64, "nvfp4_rel_max_abs": 0.5}}
    rec = _rec("gpu-golden-witness", "tp1-etp1-ep1-pp1", "not-restored", outcome="bug-reproduced",
               verify=verify, cell_id="gpu-golden-witness[golden=g,load=tp1-etp1-ep1-pp1]")
    table = T.goldens_table({"0.48.0rc1": [rec]})
    row = table.splitlines()[2]
    assert row.startswith("| 0.48.0rc1 | g,load=tp1-etp1-ep1-pp1 | bug-reproduced (expected not-restored) |")
    assert "16 restored, 16 placeholder-zero (of 32 saved)" in row and "7 of 64 non-finite" in row
