"""Expectations per nvidia-modelopt version (harness/check/versions.py) and how cells use them.

The rules are read from each version's sources (named in every Behaviour); the recorded GPU
metadata of each version (tests/test_recorded_metadata.py) checks the replica rule.
"""
from __future__ import annotations

import sys

import pytest

from harness.check import versions as V
from harness.check.judge import under_version, version_skip_reason
from harness.records import StageResult
from harness.run.cell import new_record
from harness.scenario.scenarios import load_all

pytestmark = pytest.mark.cpu


def _scenario(name):
    return next(s for s in load_all() if s.name == name)


def _cell(scenario, cell_id):
    return next(c for c in _scenario(scenario).cells() if c.id == cell_id)


@pytest.mark.parametrize("version,label", [
    ("0.45.0", "0.46.x"), ("0.46.1", "0.46.x"), ("0.47.0", "0.47.0"), ("0.48.0rc1", "0.48.0rc1"),
])
def test_known_versions(version, label):
    b = V.behaviour_for(version)
    assert b.known and b.label == label and b.notice(version) is None


@pytest.mark.parametrize("version", ["0.47.1", "0.48.0", "0.49.0.dev0", "not-a-version", None])
def test_unknown_versions_keep_the_last_buggy_expectations_with_a_notice(version):
    b = V.behaviour_for(version)
    last = V.behaviour_for(V.LAST_BUGGY)
    assert not b.known and not b.fix_applies
    assert (b.replica_rule, b.drops_expert_amax_on_reload) == (last.replica_rule,
                                                              last.drops_expert_amax_on_reload)
    assert str(version) in b.notice(version) and "unexpected-pass" in b.notice(version)


def test_rules_differ_where_the_sources_differ():
    old, bug, rc = (V.behaviour_for(v) for v in ("0.46.1", "0.47.0", "0.48.0rc1"))
    assert (old.layout, bug.layout, rc.layout) == (V.SHARED, V.PER_EXPERT, V.PER_EXPERT)
    assert (old.replica_rule, bug.replica_rule, rc.replica_rule) == (None, "buggy", "fixed")
    assert bug.drops_expert_amax_on_reload and not rc.drops_expert_amax_on_reload
    assert rc.plugin_needs_te and not bug.plugin_needs_te
    assert bug.fix_applies and not rc.fix_applies and not old.fix_applies


WITNESS_SAVE = "gpu-witness[save=tp2-etp1-ep2-pp1,save-only]"
NANO = "gpu-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]"
SECOND_BUG = "gpu-witness[save=tp1-etp1-ep8-pp1,load=tp1-etp1-ep1-pp1]"


@pytest.mark.parametrize("cell_id,per_version", [
    (WITNESS_SAVE, {"0.46.1": "pass", "0.47.0": "fail-save", "0.48.0rc1": "pass"}),
    (NANO, {"0.46.1": "pass", "0.47.0": "fail-load", "0.48.0rc1": "pass"}),
    (SECOND_BUG, {"0.46.1": "pass", "0.47.0": "amax-lost", "0.48.0rc1": "pass"}),
])
def test_witness_expectations_follow_the_version(cell_id, per_version):
    cell = _cell("gpu-witness", cell_id)
    got = {v: cell.expected_under(V.behaviour_for(v)) for v in per_version}
    assert got == per_version


@pytest.mark.parametrize("golden,per_version", [
    ("modelopt-0.46.1-tp1-etp1-ep8",
     {"0.46.1": "pass", "0.47.0": "not-restored", "0.48.0rc1": "not-restored"}),
    ("modelopt-0.47.0-tp1-etp1-ep8",
     {"0.46.1": "not-restored", "0.47.0": "amax-lost", "0.48.0rc1": "pass"}),
    ("modelopt-0.47.0-tp2-etp1-ep2-novalidate",
     {"0.46.1": "not-restored", "0.47.0": "not-restored", "0.48.0rc1": "not-restored"}),
])
def test_golden_expectations_follow_the_version(golden, per_version):
    cell = _cell("gpu-golden-witness",
                 f"gpu-golden-witness[golden={golden},load=tp1-etp1-ep1-pp1]")
    got = {v: cell.expected_under(V.behaviour_for(v)) for v in per_version}
    assert got == per_version


def test_patched_cells_expect_pass_whatever_the_version():
    cell = _cell("gpu-fix", "gpu-fix[save=tp2-etp1-ep2-pp1,save-only]")
    assert {cell.expected_under(V.behaviour_for(v)) for v in ("0.47.0", "0.48.0rc1")} == {"pass"}


def _ran(modelopt: str) -> StageResult:
    return StageResult(stage="save", ok=True, wall_s=1.0, environment={"nvidia-modelopt": modelopt})


def test_the_ranks_version_decides_the_expectation():
    """Judged by the nvidia-modelopt the stage's ranks imported, not the controller's."""
    cell = _cell("gpu-witness", WITNESS_SAVE)
    rec = new_record(cell)
    under_version(rec, cell, _ran("0.48.0rc1"))
    assert (rec.modelopt, rec.expectations, rec.expected, rec.notice) == (
        "0.48.0rc1", "0.48.0rc1", "pass", None)
    under_version(rec, cell, _ran("0.49.0"))
    assert rec.expected == "fail-save" and "0.49.0" in rec.notice


def test_the_fix_is_skipped_with_the_reason_where_it_does_not_apply():
    cell = _cell("gpu-fix", "gpu-fix[save=tp2-etp1-ep2-pp1,save-only]")
    reason = version_skip_reason(cell, V.behaviour_for("0.48.0rc1"), "0.48.0rc1")
    assert "0.47.0 only" in reason and "0.48.0rc1 is installed" in reason
    assert version_skip_reason(cell, V.behaviour_for("0.47.0"), "0.47.0") is None


def test_a_plugin_that_needs_te_is_a_skip_reason_on_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt.torch.quantization.plugins.megatron", None)
    V.plugin_problem.cache_clear()
    try:
        cell = _cell("cpu-reshard", "cpu-reshard[save=tp1-etp1-ep2-pp1,save-only]")
        reason = version_skip_reason(cell, V.behaviour_for("0.48.0rc1"), "0.48.0rc1")
        assert "megatron quantization plugin needs" in reason and "Transformer Engine" in reason
        assert version_skip_reason(cell, V.behaviour_for("0.47.0"), "0.47.0") is None
    finally:
        V.plugin_problem.cache_clear()
