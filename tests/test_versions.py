"""Expectations per nvidia-modelopt version (harness/check/versions.py) and how cells use them.

The rules are read from each version's sources (named in every Behaviour); the recorded GPU
metadata of each version (tests/test_recorded_metadata.py) checks the replica rule.
"""
from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from harness.check import versions as V
from harness.check.decision import version_skip_reason
from harness.check.judge import ran_decision
from harness.records import StageResult
from harness.run.cell import new_record
from harness.scenario.scenarios import load_all

pytestmark = pytest.mark.cpu


def _scenario(name):
    return next(s for s in load_all() if s.name == name)


WITNESS_SAVE = "gpu-witness[save=tp2-etp1-ep2-pp1,save-only]"
NANO = "gpu-witness[save=tp1-etp1-ep8-pp1,load=tp4-etp1-ep8-pp1]"
SECOND_BUG = "gpu-witness[save=tp1-etp1-ep8-pp1,load=tp1-etp1-ep1-pp1]"


def _cell(scenario, cell_id):
    return next(c for c in _scenario(scenario).cells() if c.id == cell_id)


@pytest.mark.parametrize("version,label", [
    ("0.45.0", "0.46.x"), ("0.46.1", "0.46.x"), ("0.47.0", "0.47.0 + mcore 0.16.x|0.19.2"),
    ("0.48.0rc1", "0.48.0rc1 + mcore 0.16.x|0.19.2"),
])
def test_known_versions(version, label):
    b = V.rules_for(version, "0.19.2")
    assert b.known and b.label == label and b.notice(version, "0.19.2") is None


@pytest.mark.parametrize("version,mcore", [
    ("0.47.1", "0.19.2"), ("0.48.0", "0.19.2"), ("0.49.0.dev0", "0.19.2"), ("not-a-version", "0.19.2"),
    (None, "0.19.2"), ("0.47.0", "0.17.0"), ("0.47.0", "0.20.0"), ("0.46.1", "0.15.3"),
    ("0.47.0", None),
])
def test_a_pair_without_a_rule_is_rule_unknown(version, mcore):
    """Never another pair's rule: nothing predicted, cells judged rule-unknown."""
    b = V.rules_for(version, mcore)
    assert not b.known and not b.fix_applies and b.replica_rule is None
    assert "rule unknown" in b.notice(version, mcore) and str(version) in b.notice(version, mcore)
    cell = _cell("gpu-witness", WITNESS_SAVE)
    assert cell.expected_under(b) == "rule-unknown"


# Read from the sources (harness/check/versions.py cites the lines): megatron-core 0.15's
# expert_dist_ckpt_decorator gives per-expert amax the expert-TP rank under 0.47.0 but the shared
# input amax collides at TP > ETP; 0.48.0rc1 passes tp_group=, which 0.15 lacks.
@pytest.mark.parametrize("modelopt,mcore,rule,shared,cannot_save,fix", [
    ("0.47.0", "0.15.3", "expert-tp", "expert-tp-dense-dp", False, False),
    ("0.47.0", "0.16.1", "dense-tp", "dense-tp-dense-dp", False, True),
    ("0.47.0", "0.19.2", "dense-tp", "dense-tp-dense-dp", False, True),
    ("0.48.0rc1", "0.15.3", "expert-tp", "expert-tp-dense-dp", True, False),
    ("0.48.0rc1", "0.16.1", "expert-tp", "dense-tp-dense-dp", False, False),
    ("0.48.0rc1", "0.19.2", "expert-tp", "dense-tp-dense-dp", False, False),
])
def test_pair_rules(modelopt, mcore, rule, shared, cannot_save, fix):
    b = V.rules_for(modelopt, mcore)
    assert b.known and (b.replica_rule, b.shared_rule) == (rule, shared)
    assert bool(b.cannot_save) == cannot_save and b.fix_applies == fix


@pytest.mark.parametrize("cell_id,per_pair", [
    (WITNESS_SAVE, {("0.47.0", "0.15.3"): "fail-save", ("0.47.0", "0.16.1"): "fail-save",
                    ("0.48.0rc1", "0.15.3"): "fail-save", ("0.48.0rc1", "0.16.1"): "pass"}),
    # Nano: save tp1-etp1-ep8 (TP == ETP), load tp4-etp1-ep8
    (NANO, {("0.47.0", "0.15.3"): "fail-load", ("0.47.0", "0.16.1"): "fail-load",
            ("0.48.0rc1", "0.15.3"): "fail-save", ("0.48.0rc1", "0.16.1"): "pass"}),
    # TP < ETP load: no collision on 0.15's shared rule; the second bug stays with 0.47.0
    ("gpu-witness[save=tp1-etp1-ep8-pp1,load=tp1-etp2-ep1-pp1]",
     {("0.47.0", "0.15.3"): "amax-lost", ("0.47.0", "0.16.1"): "fail-load",
      ("0.48.0rc1", "0.16.1"): "pass"}),
])
def test_witness_expectations_follow_the_pair(cell_id, per_pair):
    cell = _cell("gpu-witness", cell_id)
    assert {p: cell.expected_under(V.rules_for(*p)) for p in per_pair} == per_pair


def test_a_pair_that_cannot_save_predicts_its_exception_not_the_reports():
    from harness.check.refusals import is_bug
    from harness.records import StageCause

    b = V.rules_for("0.48.0rc1", "0.15.3")
    typeerror = StageCause(rank=0, key=None, kind="exception", exc_type="TypeError", message=(
        "make_sharded_tensors_for_checkpoint() got an unexpected keyword argument 'tp_group'"))
    report = StageCause(rank=0, kind="exception", exc_type="CheckpointingException",
                        message="Invalid access pattern for ShardedTensor(...)",
                        key="decoder.layers.0.mlp.experts.experts.4.linear_fc1.weight_quantizer._amax")
    assert is_bug(typeerror, b) and not is_bug(report, b)
    shared = StageCause(rank=0, kind="exception", exc_type="CheckpointingException",
                        message="Invalid access pattern for ShardedTensor(...)",
                        key="decoder.layers.0.mlp.experts.experts.linear_fc1.input_quantizer._amax")
    on015 = V.rules_for("0.47.0", "0.15.3")
    assert is_bug(shared, on015) and not is_bug(report, on015)
    assert is_bug(report, V.rules_for("0.47.0", "0.19.2")) and not is_bug(shared, V.rules_for("0.47.0", "0.19.2"))


def test_rules_differ_where_the_sources_differ():
    old, bug, rc = (V.rules_for(v, V.installed_mcore()) for v in ("0.46.1", "0.47.0", "0.48.0rc1"))
    assert (old.layout, bug.layout, rc.layout) == (V.SHARED, V.PER_EXPERT, V.PER_EXPERT)
    assert (old.replica_rule, bug.replica_rule, rc.replica_rule) == (None, "dense-tp", "expert-tp")
    assert bug.drops_expert_amax_on_reload and not rc.drops_expert_amax_on_reload
    assert rc.plugin_needs_te and not bug.plugin_needs_te
    assert bug.fix_applies and not rc.fix_applies and not old.fix_applies




@pytest.mark.parametrize("cell_id,per_version", [
    (WITNESS_SAVE, {"0.46.1": "pass", "0.47.0": "fail-save", "0.48.0rc1": "pass"}),
    (NANO, {"0.46.1": "pass", "0.47.0": "fail-load", "0.48.0rc1": "pass"}),
    (SECOND_BUG, {"0.46.1": "pass", "0.47.0": "amax-lost", "0.48.0rc1": "pass"}),
])
def test_witness_expectations_follow_the_version(cell_id, per_version):
    cell = _cell("gpu-witness", cell_id)
    got = {v: cell.expected_under(V.rules_for(v, V.installed_mcore())) for v in per_version}
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
    got = {v: cell.expected_under(V.rules_for(v, V.installed_mcore())) for v in per_version}
    assert got == per_version


def test_patched_cells_expect_pass_whatever_the_version():
    cell = _cell("gpu-fix", "gpu-fix[save=tp2-etp1-ep2-pp1,save-only]")
    assert {cell.expected_under(V.rules_for(v, V.installed_mcore())) for v in ("0.47.0", "0.48.0rc1")} == {"pass"}


def _ran(modelopt: str) -> StageResult:
    return StageResult(stage="save", ok=True, wall_s=1.0, environment={"nvidia-modelopt": modelopt})


def test_the_ranks_version_decides_the_expectation():
    """Judged by the nvidia-modelopt the stage's ranks imported, not the controller's."""
    cell = _cell("gpu-witness", WITNESS_SAVE)
    rec = new_record(cell)
    rec = replace(rec, **ran_decision(rec, cell.plan, _ran("0.48.0rc1"), None)[1])
    assert (rec.modelopt, rec.mcore, rec.expectations, rec.expected, rec.notice) == (
        "0.48.0rc1", "0.19.2", "0.48.0rc1 + mcore 0.16.x|0.19.2", "pass", None)
    rec = replace(rec, **ran_decision(rec, cell.plan, _ran("0.49.0"), None)[1])
    assert rec.expected == "rule-unknown" and "0.49.0" in rec.notice
    rec = replace(rec, **ran_decision(rec, cell.plan, StageResult(stage="save", ok=True, wall_s=1.0, environment={
        "nvidia-modelopt": "0.48.0rc1", "megatron-core": "0.15.3"}), None)[1])
    assert (rec.mcore, rec.expected) == ("0.15.3", "fail-save")


RESHARD = "gpu-ultra-recipe-reshard[save=tp4-etp1-ep8-pp1,load=tp2-etp2-ep4-pp1]"


def test_the_parts_the_ranks_installed_decide_the_static_rule():
    """gpu-ultra-recipe-reshard (patched, asks for part f) at ETP 1 -> 2: forecast by the ask;
    once a stage reported, by the parts its ranks installed (moe_ckpt_fix.applied_parts via
    environment.json): (f) -> the fixed rule's pass, without (f) -> today's refusal."""
    from harness.records import FIX_PARTS_ENV_KEY

    cell = _cell("gpu-ultra-recipe-reshard", RESHARD)
    assert new_record(cell).expected == "pass" and new_record(cell).fix_parts is None

    def ran(parts):
        env = {"nvidia-modelopt": "0.47.0", "megatron-core": "0.19.2"}
        return StageResult(stage="save", ok=True, wall_s=1.0,
                           environment={**env, FIX_PARTS_ENV_KEY: parts} if parts is not None else env)

    for parts, word in ((["expert-amax"], "reshard-refused"), (["expert-amax", "static-block"], "pass"),
                        (None, "reshard-refused")):  # None: the ranks said nothing of the fix
        rec = new_record(cell)
        rec = replace(rec, **ran_decision(rec, cell.plan, ran(parts), None)[1])
        assert (rec.fix_parts, rec.expected) == (parts, word)


def test_a_record_without_fix_parts_keeps_todays_judgement():
    """A record made before fix_parts (or whose ranks named none) is judged as without part (f),
    to the same fields; one naming (f) by the fixed rule."""
    from harness.check.rejudge import rejudge_record

    cell = _cell("gpu-ultra-recipe-reshard", RESHARD)
    old = {**new_record(cell).as_dict(), "outcome": "known-refusal", "failed_stage": "load",
           "exception_type": "CheckpointException", "message": "Global shape mismatch for loaded "
           "(torch.Size([4096, 1])) and expected ((8192, 1)) tensor for key decoder.layers.0.mlp."
           "experts.experts.1.linear_fc1.weight_quantizer._amax", "mcore": "0.19.2",
           "modelopt": "0.47.0"}
    assert "fix_parts" not in old
    again = rejudge_record(old, cell.plan)
    assert (again["expected"], again["outcome"]) == ("reshard-refused", "known-refusal")
    assert "fix_parts" not in again
    fixed = rejudge_record({**old, "fix_parts": ["expert-amax", "static-block"]}, cell.plan)
    assert fixed["expected"] == "pass" and fixed["outcome"] == "unexpected-failure"


def test_the_fix_is_skipped_with_the_reason_where_it_does_not_apply():
    cell = _cell("gpu-fix", "gpu-fix[save=tp2-etp1-ep2-pp1,save-only]")
    reason = version_skip_reason(cell.plan, V.rules_for("0.48.0rc1", V.installed_mcore()), "0.48.0rc1")
    assert "0.47.0 only" in reason and "0.48.0rc1 is" in reason and "megatron-core" in reason
    assert version_skip_reason(cell.plan, V.rules_for("0.47.0", V.installed_mcore()), "0.47.0") is None


def test_a_fix_cell_asking_only_for_part_f_runs_on_0_48_0rc1(monkeypatch):
    """0.48.0rc1 has parts a-e itself and part (f) from moe_ckpt_fix/modelopt_0_48_0rc1.py: a
    patched cell whose scenario needs (f) runs, judged by the fixed static-block rule; megatron-core 0.15, where the fix refuses to
    apply (moe_ckpt_fix.SUPPORTED_MCORE_VERSIONS), still skips it."""
    from harness.check.expectation import expectation
    from harness.run.cell import fix_env
    import harness.check.versions as versions

    cell = _cell("gpu-ultra-recipe-reshard",
                 "gpu-ultra-recipe-reshard[save=tp4-etp1-ep8-pp1,load=tp2-etp2-ep4-pp1]")
    assert cell.plan.fix_parts == ("static-block",)
    on_048 = V.rules_for("0.48.0rc1", "0.19.2")
    assert version_skip_reason(cell.plan, on_048, "0.48.0rc1", "0.19.2") is None
    assert version_skip_reason(cell.plan, V.rules_for("0.48.0rc1", "0.15.3"), "0.48.0rc1", "0.15.3")
    kinds = {"experts": ("static-block",), "shared_experts": ("scalar",), "other": ("scalar",)}
    assert expectation(cell.plan, on_048, kinds, cell.plan.fix_parts)[0] == "pass"
    assert expectation(cell.plan, on_048, kinds, ())[0] == "reshard-refused"
    whole_fix = _cell("gpu-fix", "gpu-fix[save=tp2-etp1-ep2-pp1,save-only]")
    assert version_skip_reason(whole_fix.plan, on_048, "0.48.0rc1", "0.19.2")
    # a version whose fix is still unproven is asked for by name with the scenario's parts
    import harness.fix

    monkeypatch.delenv("MOE_CKPT_FIX_UNPROVEN", raising=False)
    monkeypatch.setattr(versions, "installed_modelopt", lambda: "9.9.9")
    monkeypatch.setitem(harness.fix.UNPROVEN_MODELOPT_VERSIONS, "9.9.9", "a test's")
    assert fix_env(("static-block",)) == {"MOE_CKPT_FIX_UNPROVEN": "9.9.9,static-block"}
    assert fix_env(()) == {"MOE_CKPT_FIX_UNPROVEN": ""}
    monkeypatch.setattr(versions, "installed_modelopt", lambda: "0.48.0rc1")
    assert fix_env(("static-block",)) == {"MOE_CKPT_FIX_UNPROVEN": "static-block"}


def test_a_plugin_that_needs_te_is_a_skip_reason_on_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt.torch.quantization.plugins.megatron", None)
    V.plugin_problem.cache_clear()
    try:
        cell = _cell("cpu-reshard", "cpu-reshard[save=tp1-etp1-ep2-pp1,save-only]")
        reason = version_skip_reason(cell.plan, V.rules_for("0.48.0rc1", V.installed_mcore()), "0.48.0rc1")
        assert "megatron quantization plugin needs" in reason and "Transformer Engine" in reason
        assert version_skip_reason(cell.plan, V.rules_for("0.47.0", V.installed_mcore()), "0.47.0") is None
    finally:
        V.plugin_problem.cache_clear()


@pytest.mark.parametrize("mcore,problem", [
    ("0.19.2", False), ("0.19.2+dc038c6", False), ("0.15.3", False), ("0.16.1", False),
    ("0.17.0", True), ("0.20.0", True),
])
def test_supported_megatron_core_range_and_its_override(mcore, problem, monkeypatch):
    from harness.machine import MCORE_OVERRIDE, mcore_problem

    monkeypatch.delenv(MCORE_OVERRIDE, raising=False)
    line = mcore_problem(mcore)
    assert bool(line) == problem
    if problem:
        assert mcore in line and "untested" in line and f"set {MCORE_OVERRIDE}=1" in line
        assert "\n" not in line
        monkeypatch.setenv(MCORE_OVERRIDE, "1")
        assert "running anyway" in mcore_problem(mcore)


def test_a_local_build_of_a_release_has_that_releases_rule():
    assert V.rules_for("0.47.0", "0.19.2+dc038c6") is V.rules_for("0.47.0", "0.19.2")


@pytest.mark.parametrize("mcore", ["0.15.3", "0.17.0"])
def test_the_fix_refuses_a_megatron_core_it_does_not_apply_to(mcore, monkeypatch):
    import harness.fix as fix

    monkeypatch.setattr(fix, "_installed_mcore_version", lambda: mcore)
    with pytest.raises(fix.UnsupportedModeloptVersion) as exc:
        fix.apply()
    line = str(exc.value)
    assert f"megatron-core {mcore} is installed" in line and "nothing was patched" in line
    assert "\n" not in line
