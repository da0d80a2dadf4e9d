"""`harness matrix` over (modelopt, megatron-core) pairs: the MCORE axis, the 2-D table, and one
bad pair (a missing wheel) being one line while the other pairs still run."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.run import matrix
from harness.report.matrix_table import TableEntry

pytestmark = pytest.mark.cpu


def test_a_series_is_its_newest_tested_patch_and_bad_values_are_one_line():
    assert matrix.mcores_from(SimpleNamespace(mcore=["0.15.x", "0.16.x", "0.19.2"])) == [
        "0.15.3", "0.16.1", "0.19.2"]
    assert matrix.mcores_from(SimpleNamespace(mcore=[])) == ["0.19.2"]
    for bad in ("0.17.x", "bogus", "0.16"):
        with pytest.raises(ValueError, match="--mcore"):
            matrix.mcores_from(SimpleNamespace(mcore=[bad]))


def test_a_missing_wheel_is_one_line_and_the_other_pairs_still_run(tmp_path, monkeypatch, capsys):
    ran = []

    def fake(v, root, mcore=None):
        ran.append((v, mcore))
        if mcore == "0.15.3":
            return {"import": TableEntry({"error": 1}, [], "no env: matrix-env: system mode needs "
                                         "megatron-core 0.15.3's wheel in .whl-mc0153")}, []
        return {"witness": TableEntry({"pass": 3}, ["gpu-shared"])}, [
            {"cell_id": "x", "scenario": "gpu-witness", "outcome": "pass", "modelopt": v,
             "mcore": mcore}]

    monkeypatch.setattr(matrix, "run_version", fake)
    rc = matrix.main(SimpleNamespace(modelopt=["0.48.0rc1"], mcore=["0.15.x", "0.19.2"],
                                     from_runs=[], results_root=str(tmp_path)))
    out, err = capsys.readouterr()
    assert rc == 1 and sorted(ran) == [("0.48.0rc1", "0.15.3"), ("0.48.0rc1", "0.19.2")]
    errors = [ln for ln in err.splitlines() if ln.startswith("matrix: error:")]
    assert errors == [next(e for e in errors if "modelopt 0.48.0rc1 + mcore 0.15.3" in e)]
    assert "| modelopt \\ megatron-core | 0.15.3 | 0.19.2 |" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("| 0.48.0rc1 |"))
    assert "no env/import" in row and ".whl-mc0153" in row and "3 pass" in row
    # the table renders again from its file, pairs intact
    again = matrix.main(SimpleNamespace(modelopt=[], mcore=[], results_root=str(tmp_path),
                                        from_runs=[str(next(tmp_path.glob("matrix-*")))]))
    assert again == 1 and "| 0.48.0rc1 |" in capsys.readouterr().out


def test_a_cut_off_matrix_run_renders_from_its_pair_records(tmp_path):
    """A matrix call stopped before its table (the H200 0.47.0 pairs call): `--from` rebuilds the
    rows from each pair's records, re-judged the way the verdict reads them."""
    import shutil

    from harness.paths import REPO_ROOT as ROOT
    from harness.run import matrix as M

    run = "20261204-020324-matrix-0.47.0-mc0.16.1"
    pair = tmp_path / "0.47.0-mc0.16.1"
    (pair / "results" / run).mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "runs" / f"{run}.results.json",
                pair / "results" / run / "results.json")
    (pair / "import.log").write_text("modelopt 0.47.0 megatron-core 0.16.1 | plugin ok\n")
    [(label, (cells, records))] = M.from_files([str(tmp_path)]).items()
    assert label == "modelopt 0.47.0 + mcore 0.16.1"
    assert cells["import"].note.startswith("0.47.0 megatron-core 0.16.1")
    golden = [r for r in records if r["scenario"] == "gpu-golden-witness"]
    assert len(golden) == 6 and all(r["outcome"] == "skipped" for r in golden)  # recorded otherwise
    assert cells["witness"].counts == {"bug-reproduced": 3, "blocked": 1, "pass": 1}
