"""megatron-core's torch_dist format per release: <= 0.16 needs common.pt, 0.19.2 writes none
(harness/check/versions.py NEEDS_COMMON_PT, read from both sources; the H200 pairs run showed
0.15.3 and 0.16.1 refusing every golden with an AttributeError from their own error path)."""
from __future__ import annotations

import shutil

import pytest

from harness.check import decision, judge
from harness.check import defects
from harness.check import versions as V
from harness.golden.forecast import REFUSED, advice, forecast
from harness.golden.layout import inspect_checkpoint
from harness.paths import REPO_ROOT
from harness.records import CellRecord, StageCause, StageResult
from harness.scenario.scenarios import load_all

pytestmark = pytest.mark.cpu
GOLDEN = "modelopt-0.47.0-tp1-etp1-ep8"
CELL_ID = f"gpu-golden-witness[golden={GOLDEN},load=tp1-etp1-ep1-pp1]"


def _cell():
    s = next(s for s in load_all() if s.name == "gpu-golden-witness")
    return next(c for c in s.cells() if c.id == CELL_ID)


def test_the_committed_goldens_have_no_common_pt():
    # what megatron-core 0.19.2 wrote; if this changes, the rule below must be read again
    assert not (REPO_ROOT / "tests" / "golden" / GOLDEN / "ckpt" / defects.COMMON_PT).exists()


@pytest.mark.parametrize("mcore,refused", [("0.15.3", True), ("0.16.1", True), ("0.16.0", True),
                                           ("0.19.2", False), ("not-a-version", False)])
def test_common_pt_problem_per_release(tmp_path, mcore, refused):
    problem = defects.common_pt_problem(tmp_path, mcore)
    assert bool(problem) is refused
    if refused:
        assert str(tmp_path) in problem and "common.pt" in problem and mcore in problem
    (tmp_path / defects.COMMON_PT).write_bytes(b"")
    assert defects.common_pt_problem(tmp_path, mcore) is None


def test_a_golden_the_megatron_core_cannot_read_is_skipped_with_the_reason():
    cell = _cell()
    b = V.rules_for("0.47.0", "0.16.1")
    reason = decision.version_skip_reason(cell.plan, b, "0.47.0", "0.16.1")
    assert reason and GOLDEN in reason and "common.pt" in reason and "0.16.1" in reason
    assert decision.version_skip_reason(cell.plan, V.rules_for("0.47.0", "0.19.2"), "0.47.0", "0.19.2") is None


def test_a_golden_with_common_pt_is_not_skipped(tmp_path):
    cell = _cell()
    root = tmp_path / "golden"
    shutil.copytree(REPO_ROOT / "tests" / "golden" / GOLDEN, root / GOLDEN)
    (root / GOLDEN / "ckpt" / defects.COMMON_PT).write_bytes(b"")
    from harness.golden.manifest import read_manifest, write_manifest

    old = read_manifest(root / GOLDEN)  # the copy's manifest lists the file it now holds
    write_manifest(root / GOLDEN, **{k: old[k] for k in ("topology", "made_by", "layout",
                                                         "versions", "notes", "date", "size")
                                     if k in old})
    import dataclasses
    cell = dataclasses.replace(cell, scenario=dataclasses.replace(cell.scenario, golden_root=root))
    assert decision.version_skip_reason(cell.plan, V.rules_for("0.47.0", "0.16.1"), "0.47.0", "0.16.1") is None


def test_not_restored_counts_only_an_amax_refusal():
    key = "decoder.layers.0.mlp.experts.experts.4.linear_fc1.weight_quantizer._amax"
    refused = StageCause(rank=0, kind="exception", key=key,
                         exc_type="megatron.core.dist_checkpointing.core.CheckpointingException",
                         message=f"Invalid access pattern for ShardedTensor(key='{key}'")
    dcp = StageCause(rank=0, kind="exception", key=key, message="CheckpointException ranks:",
                     exc_type="torch.distributed.checkpoint.api.CheckpointException")
    other = StageCause(rank=0, kind="exception", key=None, exc_type="AttributeError",
                       message="'str' object has no attribute 'iterdir'")
    golden = "modelopt-0.47.0-tp2-etp1-ep2-novalidate"  # expects not-restored under 0.47.0
    s = next(s for s in load_all() if s.name == "gpu-golden-witness")
    cell = next(c for c in s.cells() if c.golden == golden and c.load.id == "tp1-etp1-ep1-pp1")
    for cause, outcome in ((refused, "bug-reproduced"), (dcp, "bug-reproduced"),
                           (other, "unexpected-failure")):
        rec = CellRecord(scenario=s.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                         save_topology=cell.save.id, load_topology=cell.load.id, patch="none",
                         expected="", modelopt="0.47.0", mcore="0.19.2")
        env = {"nvidia-modelopt": "0.47.0", "megatron-core": "0.19.2"}
        rec = judge.judge_cell(rec, cell.plan, StageResult(stage="save", ok=True, wall_s=0.1, environment=env),
                               StageResult(stage="load", ok=False, wall_s=1.0, environment=env, cause=cause))
        assert (rec.expected, rec.outcome) == ("not-restored", outcome), (cause, rec.reason)


def test_forecast_names_the_format_for_megatron_core_0_16():
    lay = inspect_checkpoint(REPO_ROOT / "tests" / "golden" / GOLDEN / "ckpt")
    assert lay.has_common_pt is False
    by_mcore = {(f.modelopt, f.megatron_core): f for f in forecast(lay)}
    old = by_mcore[("0.48.0rc1", "0.16.1")]
    assert old.outcome == REFUSED and "common.pt" in old.line and "megatron-core" in old.remedy
    assert by_mcore[("0.48.0rc1", "0.19.2")].outcome != REFUSED
    # the verdict's advice is about a job's checkpoint of that kind, in its own format
    assert "common.pt" not in "\n".join(advice("0.48.0rc1"))
