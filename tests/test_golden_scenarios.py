"""Golden checkpoints as the save side of a scenario (scenarios/gpu_golden*.toml), cpu tier.

Expectations follow the rules the scenarios state: patched -> pass; unpatched, a shared (0.46.1)
or incomplete golden -> not-restored, a complete one -> the oracle (collision at TP != ETP,
amax lost where a load rank holds several experts). The layout comes from the checkpoint's
metadata, read before anything loads it. The judging is exercised with the load stage replaced
by recorded-shape stage results (the real loads need TE: docs/runs/20261202-150543-golden).
"""
from __future__ import annotations

import pytest

from harness.paths import RunDir
from harness.records import StageCause, StageResult
from harness.run import cell as runner
from harness.scenario.goldens import golden_layout
from harness.scenario.scenarios import ScenarioError, load_all, load_scenario

pytestmark = pytest.mark.cpu
A, B, C = ("modelopt-0.46.1-tp1-etp1-ep8", "modelopt-0.47.0-tp1-etp1-ep8",
           "modelopt-0.47.0-tp2-etp1-ep2-novalidate")


def _cells(name):
    return {c.id: c for s in load_all() if s.name == name for c in s.cells()}


def test_layouts_read_from_the_goldens_metadata():
    assert (golden_layout(A), golden_layout(B), golden_layout(C)) == ("shared", "complete", "incomplete")


def test_golden_cells_and_expectations():
    fix, witness = _cells("gpu-golden"), _cells("gpu-golden-witness")
    assert len(fix) == 15 and {c.expected for c in fix.values()} == {"pass"}
    got = {(c.golden, c.load.id): c.expected for c in witness.values()}
    assert got == {
        (A, "tp1-etp1-ep1-pp1"): "not-restored", (A, "tp2-etp1-ep2-pp1"): "not-restored",
        (B, "tp1-etp1-ep1-pp1"): "amax-lost", (B, "tp2-etp1-ep2-pp1"): "fail-load",
        (C, "tp1-etp1-ep1-pp1"): "not-restored", (C, "tp2-etp1-ep2-pp1"): "not-restored",
    }
    cell = fix[f"gpu-golden[golden={A},load=tp1-etp1-ep1-pp1]"]
    assert cell.world == 1 and cell.save_id == f"golden-{A}"  # no save stage runs
    assert cell.scenario.size.hidden_size == 128  # the goldens' recorded size, not GPU_SIZE


@pytest.mark.parametrize("body, words", [
    ('saves = ["tp1-etp1-ep1"]\ngoldens = ["%s"]' % A, "either saves or goldens"),
    ('goldens = ["no-such-golden"]', "'no-such-golden' not found"),
])
def test_bad_golden_scenarios_name_the_problem(tmp_path, body, words):
    p = tmp_path / "bad.toml"
    p.write_text(f'tier = "gpu-shared"\nbackend = "te"\n{body}\nloads = ["tp1-etp1-ep1"]\n')
    with pytest.raises(ScenarioError, match=words):
        load_scenario(p)


def _stage(ok=True, verify=None, cause=None):
    return StageResult(stage="load", ok=ok, wall_s=1.0, teardown_s=0.1,
                       cause=StageCause(**cause) if cause else None,
                       rank_results={"0": {"verify": verify or {}}})


@pytest.mark.parametrize("stage, outcome", [
    (_stage(verify={"mismatch_count": 0, "missing_keys": ["k.weight_quantizer._amax"]}), "bug-reproduced"),
    (_stage(verify={"mismatch_count": 0, "missing_keys": []}), "unexpected-pass"),
    (_stage(ok=False, cause={"rank": 0, "kind": "exception",
                             "exc_type": "torch.distributed.checkpoint.api.CheckpointException",
                             "message": "CheckpointException ranks:dict_keys([0])",
                             "key": "decoder.layers.0.mlp.experts.experts.4.linear_fc1.weight_quantizer._amax"}),
     "bug-reproduced"),
    # any other failure is not the checkpoint's amax refused (judge.is_amax_refusal)
    (_stage(ok=False, cause={"rank": 0, "kind": "exception", "exc_type": "KeyError",
                             "message": "Missing key in checkpoint", "key": None}), "unexpected-failure"),
])
def test_not_restored_judging(tmp_path, monkeypatch, stage, outcome):
    cell = _cells("gpu-golden-witness")[f"gpu-golden-witness[golden={A},load=tp1-etp1-ep1-pp1]"]
    monkeypatch.setattr(runner, "_launch", lambda spec, d, c, run: stage)
    rec = runner.run_cell(cell, tmp_path)
    assert rec.outcome == outcome, rec
    assert (RunDir(tmp_path).save(f"golden-{A}").reference / "shards_rank0.pt").is_file()
