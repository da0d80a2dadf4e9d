"""The equivalence rule between two runs of the same cells (harness/report/equivalence.py)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.equivalence import differences

pytestmark = pytest.mark.cpu

RUN = Path(__file__).resolve().parent / "data" / "runs" / "20261203-033850-pipeline.results.json"


def test_a_run_is_equivalent_to_itself_with_other_timings():
    doc = json.loads(RUN.read_text())
    other = copy.deepcopy(doc)
    for c in other["cells"]:
        c["durations"] = {k: v + 1 for k, v in c["durations"].items()}
        c["teardown_s"], c["memory"], c["message"] = 9.9, {}, (c["message"] or "") + " elsewhere"
    assert differences(doc, other) == []


@pytest.mark.parametrize("field, value", [("outcome", "pass"), ("failing_key", "x"),
                                          ("first_failure_rank", 3), ("exception_type", "E")])
def test_a_changed_result_field_is_named(field, value):
    doc = json.loads(RUN.read_text())
    other = copy.deepcopy(doc)
    cell = next(c for c in other["cells"] if c["outcome"] == "bug-reproduced")
    cell[field] = value
    assert differences(doc, other) == [f"{cell['cell_id']}: {field} "
                                       f"{next(c for c in doc['cells'] if c['cell_id'] == cell['cell_id'])[field]!r} != {value!r}"]


def test_verify_figures_and_missing_cells_count(tmp_path, capsys):
    doc = json.loads(RUN.read_text())
    other = copy.deepcopy(doc)
    cell = next(c for c in other["cells"] if c["verify"].get("mismatch_count") == 0)
    cell["verify"]["mismatch_count"] = 1
    dropped = other["cells"].pop()
    diffs = differences(doc, other)
    assert f"{cell['cell_id']}: verify.mismatch_count 0 != 1" in diffs
    assert f"{dropped['cell_id']}: only in the reference run" in diffs
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    b.write_text(json.dumps(other))
    assert main(["equivalence", str(a), str(b)]) == 1
    assert "NOT equivalent: 2 difference(s)" in capsys.readouterr().out
    assert main(["equivalence", str(a), str(a)]) == 0
    assert main(["equivalence", str(a), str(tmp_path / "missing.json")]) == 2


def test_the_run_id_inside_a_verify_figure_is_not_a_difference():
    """Recorded on the H200: a golden checkpoint is copied into the run directory and the fix's
    load warnings name it, so the same warning differs by run id between two runs."""
    doc = json.loads(RUN.read_text())
    other = copy.deepcopy(doc)
    other["run_id"] = "20261203-100023-eq-pool"
    a, b = (next(c for c in d["cells"] if c["verify"]) for d in (doc, other))
    a["verify"]["load_warnings"] = [f"moe-ckpt-fix: results/{doc['run_id']}/saves/g/ckpt holds x"]
    b["verify"]["load_warnings"] = [f"moe-ckpt-fix: results/{other['run_id']}/saves/g/ckpt holds x"]
    assert differences(doc, other) == []
    b["verify"]["load_warnings"] = [f"moe-ckpt-fix: results/{other['run_id']}/saves/g/ckpt holds y"]
    assert len(differences(doc, other)) == 1


def test_outcomes_only_compares_the_cells_both_runs_ran():
    """Another transport (NCCL against gloo): outcome, exception, failing key and failed stage of
    the cells both ran; first rank and figures may differ, interrupted cells say nothing."""
    doc = json.loads(RUN.read_text())
    other = copy.deepcopy(doc)
    bug = next(c for c in other["cells"] if c["outcome"] == "bug-reproduced")
    bug["first_failure_rank"], bug["verify"] = 7, {"elsewhere": 1}
    others = [c for c in other["cells"] if c is not bug]
    others[0]["outcome"] = "interrupted"
    other["cells"].remove(others[-1])
    assert differences(doc, other, outcomes_only=True) == []
    bug["failing_key"] = "another.key"
    assert differences(doc, other, outcomes_only=True) == [
        f"{bug['cell_id']}: failing_key "
        f"{next(c for c in doc['cells'] if c['cell_id'] == bug['cell_id'])['failing_key']!r} != 'another.key'"]


def test_rejudged_compares_runs_recorded_under_different_rules(capsys):
    """Recorded: the Nano fix cell on gloo (H200, 2026-12-02) failed under that day's rule (the
    cross-topology logits were asserted); on NCCL sharing the H100 (2026-12-06) it passed under
    today's. Judged again under one rule set, the two transports give the same answer."""
    runs = RUN.parent
    gloo, nccl = (str(runs / f) for f in ("20261202-144727-fix2.results.json",
                                          "20261206-081258-nccl-cells.results.json"))
    assert main(["equivalence", "--outcomes-only", gloo, nccl]) == 1
    assert "'unexpected-failure' != 'pass'" in capsys.readouterr().out
    assert main(["equivalence", "--outcomes-only", "--rejudged", gloo, nccl]) == 0
    assert "equivalent: 2 cells both ran" in capsys.readouterr().out


@pytest.mark.parametrize("nccl_run, differs_unrejudged", [
    ("20261206-152142-nccl-cells.results.json", True),    # fix cell: gloo's day asserted cross-topology logits
    ("20261206-152801-nccl-cells.results.json", False)])  # witness: the collision, same key on both
def test_the_nano_production_shape_gives_the_same_answer_on_nccl(capsys, nccl_run, differs_unrejudged):
    """Recorded: the Nano production shape (128 experts, 23 layers) on gloo ranks sharing an
    H200 (2026-12-03) and on 8 NCCL ranks sharing an H100 (2026-12-06)."""
    gloo, nccl = (str(RUN.parent / f) for f in ("20261203-034324-shape-nano.results.json", nccl_run))
    assert main(["equivalence", "--outcomes-only", gloo, nccl]) == int(differs_unrejudged)
    capsys.readouterr()
    assert main(["equivalence", "--outcomes-only", "--rejudged", gloo, nccl]) == 0
    assert "equivalent: 1 cells both ran" in capsys.readouterr().out
