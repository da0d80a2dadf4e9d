"""Kinds, not names: a cell is judged by the pair's rule for each
(amax kind, module family) its save recorded, each family split as megatron-core splits it; the
recipe catalogue is a forecast, checked against the record; the decision is made once per cell.

Expectations come from the rules in harness/check/versions.py (each with its source lines:
0.47.0's dense-TP replica ids on every per-expert weight-quantizer tensor, a static kind's
``_global_amax`` included; the static block ``_amax`` refused at another expert TP; dense
linears with megatron-core's own replica ids), never from a run of the harness.
"""
from __future__ import annotations

import pytest

from harness.check import decision as decision_module
from harness.check import judge
from harness.check.rejudge import rejudge_record
from harness.check.versions import rules_for
from harness.check.recipes import ULTRA_4O6
from harness.records import CauseKind, CellRecord, StageCause, StageResult
from harness.scenario.scenarios import load_scenario
from tests.helpers import own_recipe_job

pytestmark = pytest.mark.cpu

MINE = "file:tests/data/recipes/nvfp4_static_experts.yaml"  # no forecast names it
STATIC = {"experts": ["static-block"]}
HEAD = 'tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\n'


def _cell(tmp_path, recipe, save, load, patch="none", name="c"):
    path = tmp_path / f"{name}.toml"
    path.write_text(HEAD + f'patch = "{patch}"\nrecipe = "{recipe}"\nsaves = ["{save}"]\n'
                    f'loads = ["{load}"]\n')
    return next(c for c in load_scenario(path).cells() if c.load)


def _record(cell, modelopt) -> CellRecord:
    return CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                      save_topology=cell.save.id, load_topology=cell.load.id,
                      patch=cell.scenario.patch, expected="", modelopt=modelopt, mcore="0.19.2",
                      recipe=cell.scenario.recipe)


def _env(modelopt):
    return {"nvidia-modelopt": modelopt, "megatron-core": "0.19.2"}


def _save(modelopt, kinds) -> StageResult:
    return StageResult(stage="save", ok=True, wall_s=1.0, environment=_env(modelopt),
                       rank_results={"0": {"amax_kinds": kinds}})


def _collision(modelopt, key) -> StageResult:
    cause = StageCause(rank=0, kind=CauseKind.EXCEPTION,
                       exc_type="megatron.core.dist_checkpointing.core.CheckpointingException",
                       message=f"Invalid access pattern for ShardedTensor(key='{key}', ...)", key=key)
    return StageResult(stage="load", ok=False, wall_s=1.0, environment=_env(modelopt), cause=cause)


def _passed(modelopt) -> StageResult:
    verify = {"mismatch_count": 0, "mismatches": [], "missing_keys": [], "unexpected_keys": []}
    return StageResult(stage="load", ok=True, wall_s=1.0, environment=_env(modelopt),
                       rank_results={"0": {"verify": verify}})


GLOBAL_KEY = "decoder.layers.0.mlp.experts.experts.3.linear_fc1.weight_quantizer._global_amax"


def test_a_users_recipe_is_judged_by_the_kinds_its_save_recorded(tmp_path):
    """0.47.0 at TP 2 > ETP 1: its dense-TP replica ids give every per-expert weight-quantizer
    tensor no main replica, the static kind's _global_amax as much as its block _amax
    (versions.py _STATIC_SOURCE): the refusal on _global_amax is the bug reproduced."""
    cell = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp2-etp1-ep4")
    rec = judge.judge_cell(_record(cell, "0.47.0"), cell.plan, _save("0.47.0", STATIC),
                           _collision("0.47.0", GLOBAL_KEY))
    assert (rec.expected, rec.outcome) == ("fail-load", "bug-reproduced"), (rec.notice, rec.reason)
    assert rec.amax_kinds == STATIC and rec.forecast_disagreement is None  # no forecast to disagree


def test_before_its_save_a_users_recipe_predicts_nothing_and_says_why(tmp_path):
    cell = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp2-etp1-ep4")
    d = decision_module.decide(cell.plan, "0.47.0", "0.19.2")
    assert d.expected == "rule-unknown"
    assert "no amax kinds of the routed experts known" in d.notice and MINE in d.notice


def test_global_amax_is_the_bug_only_for_a_kind_that_has_one(tmp_path):
    """A scalar kind has no _global_amax: a refusal naming one is not the predicted collision."""
    cell = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp2-etp1-ep4")
    rec = judge.judge_cell(_record(cell, "0.47.0"), cell.plan, _save("0.47.0", {"experts": ["scalar"]}),
                           _collision("0.47.0", GLOBAL_KEY))
    assert (rec.expected, rec.outcome) == ("fail-load", "unexpected-failure")


def test_the_recorded_kinds_decide_and_the_forecast_disagreement_is_named(tmp_path):
    """The Ultra recipe forecasts static NVFP4 experts (reshard-refused at an ETP change); a save
    that recorded scalar experts is judged as scalar: under 0.48.0rc1 (expert-TP replica ids, no
    second bug) an ETP change of a replicated (1,) amax passes."""
    cell = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp2-etp2-ep2")
    assert cell.expected_under(rules_for("0.48.0rc1", "0.19.2")) == "reshard-refused"
    rec = judge.judge_cell(_record(cell, "0.48.0rc1"), cell.plan,
                           _save("0.48.0rc1", {"experts": ["scalar"]}), _passed("0.48.0rc1"))
    assert (rec.expected, rec.outcome) == ("pass", "pass"), rec.notice
    assert "'experts': ['scalar']" in rec.forecast_disagreement
    assert "'experts': ['static-block']" in rec.forecast_disagreement


def test_each_family_is_split_its_own_way(tmp_path):
    """Shared experts are split over TP, routed experts over expert TP. Under 0.48.0rc1 a TP change
    that keeps ETP leaves static routed experts as saved, but refuses per-block shared experts
    (dense_per_block_rule, decided on the GPU 2026-12-06); the same cell with scalar shared
    experts passes, and so does a change of EP alone."""
    kinds = {"experts": ["static-block"], "shared_experts": ["per-block"]}
    tp_change = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp2-etp1-ep4")
    assert decision_module.decide(tp_change.plan, "0.48.0rc1", "0.19.2", kinds).expected == "reshard-refused"
    same_tp = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp1-etp1-ep2", name="same")
    assert decision_module.decide(same_tp.plan, "0.48.0rc1", "0.19.2", kinds).expected == "pass"
    scalar_shared = {"experts": ["static-block"], "shared_experts": ["scalar"]}
    assert decision_module.decide(tp_change.plan, "0.48.0rc1", "0.19.2", scalar_shared).expected == "pass"
    etp_change = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp1-etp2-ep2", name="etp")
    assert decision_module.decide(etp_change.plan, "0.48.0rc1", "0.19.2", scalar_shared).expected == "reshard-refused"


def test_a_kind_without_any_rule_is_named(tmp_path):
    cell = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp1-etp1-ep2")
    d = decision_module.decide(cell.plan, "0.48.0rc1", "0.19.2", {"experts": ["shaped(64, 1)"]})
    assert d.expected == "rule-unknown"
    assert "no rule for amax kind 'shaped(64, 1)' of the experts under 0.48.0rc1" in d.notice


def test_a_recorded_cell_of_a_users_recipe_rejudges_to_a_decision(tmp_path):
    """A results.json cell recorded as rule-unknown (no catalogue entry) with its kinds."""
    cell = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp2-etp2-ep2")
    recorded = {**_record(cell, "0.47.0").as_dict(), "expected": "rule-unknown", "amax_kinds": STATIC,
                "outcome": "rule-unknown", "failed_stage": "load",
                "exception_type": "torch.distributed.checkpoint.api.CheckpointException",
                "message": "CheckpointingException: Global shape mismatch for loaded (4096, 1) and "
                           "expected (8192, 1) tensor for key decoder.layers.0.mlp.experts.experts.1."
                           "linear_fc1.weight_quantizer._amax"}
    again = rejudge_record(recorded, cell.plan)
    assert (again["expected"], again["outcome"]) == ("reshard-refused", "known-refusal")


def test_a_job_with_its_own_recipe_file_gets_a_verdict(tmp_path):
    """`verdict --quarantine FILE` on a job whose recipe is a file: its witness reproduces the
    collision at the job's shapes (0.47.0, TP 2 > ETP 1), so the job is BLOCKED, not RULE UNKNOWN."""
    from harness.report import verdict

    quarantine, scenarios = own_recipe_job(tmp_path, MINE, "tp1-etp1-ep4", ["tp2-etp1-ep4", "tp1-etp1-ep2"])
    base = dict(tier="gpu-shared", backend="te", patch="none", modelopt="0.47.0", mcore="0.19.2",
                recipe=MINE, amax_kinds=STATIC, save_topology="tp1-etp1-ep4-pp1")
    verify = {"mismatch_count": 0, "keys_compared": 40, "missing_keys": []}
    records = {}
    for c in scenarios[0].cells():
        if c.load is None:
            records[c.id] = {**base, "cell_id": c.id, "outcome": "pass", "expected": "pass"}
        elif c.load.tp == 2:
            records[c.id] = {**base, "cell_id": c.id, "load_topology": c.load.id, "outcome": "rule-unknown",
                             "expected": "rule-unknown", "failed_stage": "load",
                             "exception_type": "CheckpointingException", "failing_key": GLOBAL_KEY,
                             "message": f"Invalid access pattern for ShardedTensor(key='{GLOBAL_KEY}')"}
        else:
            records[c.id] = {**base, "cell_id": c.id, "load_topology": c.load.id, "outcome": "rule-unknown",
                             "expected": "rule-unknown", "verify": verify}
    (v,) = verdict.judge_records(records, quarantine, scenarios)
    assert v.word == verdict.BLOCKED, (v.word, v.detail)
    outcomes = {e.cell_id: e.outcome for e in v.evidence if e.role == verdict.Role.WITNESS}
    assert sorted(outcomes.values()) == ["bug-reproduced", "pass", "pass"]


# --- decided once (item 6) ----------------------------------------------------------------------

def test_a_cell_is_decided_once(tmp_path, monkeypatch):
    """run_cell: the controller's decision (skip reason and expectation) is the one the judge
    uses when the ranks imported the same pair and the save recorded the forecast kinds."""
    from harness.check.versions import installed_modelopt
    from harness.run import cell as run_cell_module

    cell = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp1-etp1-ep2")
    modelopt, calls = installed_modelopt(), []
    real = decision_module.expectation
    monkeypatch.setattr(decision_module, "expectation", lambda *a, **k: calls.append(a) or real(*a, **k))
    env = {"nvidia-modelopt": modelopt}
    monkeypatch.setattr(run_cell_module, "run_save", lambda c, run: StageResult(
        stage="save", ok=True, wall_s=1.0, environment=env, rank_results={"0": {"amax_kinds": STATIC}}))
    monkeypatch.setattr(run_cell_module, "_launch", lambda *a: StageResult(
        stage="load", ok=True, wall_s=1.0, environment=env,
        rank_results={"0": {"verify": {"mismatch_count": 0, "missing_keys": []}}}))
    rec = run_cell_module.run_cell(cell, tmp_path / "run")
    assert rec.outcome == "pass" and rec.expected == "pass", (rec.notice, rec.reason)
    assert len(calls) == 1


def test_judging_returns_a_new_record(tmp_path):
    cell = _cell(tmp_path, MINE, "tp1-etp1-ep4", "tp2-etp1-ep4")
    rec = _record(cell, "0.47.0")
    before = rec.as_dict()
    new = judge.judge_cell(rec, cell.plan, _save("0.47.0", STATIC), _collision("0.47.0", GLOBAL_KEY))
    assert new is not rec and rec.as_dict() == before and new.outcome == "bug-reproduced"


@pytest.mark.parametrize("kinds, keeps", [
    ({"experts": ["scalar"]}, False),  # 0.47.0's second bug re-calibrates them through expert 0
    ({"experts": ["static-block"]}, True),  # complete static state: no re-calibration
    ({"experts": ["per-block"]}, False),  # 0.47.0's second bug reaches a per-block amax too
    ({}, False),
])
def test_the_save_trusts_its_reloaded_logits_by_the_kinds_it_made(kinds, keeps):
    """The save stage's reference logits come from a reload only where the installed pair's rule
    for the routed experts' recorded kinds keeps their amax (not from the recipe's name)."""
    from types import SimpleNamespace

    import modelopt

    from harness.rank.stages import _reload_keeps_state

    if modelopt.__version__ != "0.47.0":
        pytest.skip(f"the expectations are 0.47.0's rules; {modelopt.__version__} is installed")
    assert _reload_keeps_state(SimpleNamespace(patch="none", backend="te"), kinds) is keeps


def test_the_controllers_decision_is_not_reused_once_the_save_recorded_other_kinds(tmp_path):
    """run_cell hands judge_cell the decision it made from the forecast (static NVFP4 experts for
    the four-over-six recipe). Patched, a static block amax loaded at another expert TP is refused
    its global shape (reshard-refused); a scalar amax is not (pass). A save that recorded scalar
    experts is judged by them, and says it disagrees with the forecast."""
    from harness.records import FIX_PARTS_ENV_KEY

    cell = _cell(tmp_path, ULTRA_4O6, "tp1-etp1-ep4", "tp1-etp2-ep2", patch="fix")
    forecast = decision_module.decide(cell.plan, "0.47.0", "0.19.2")
    assert forecast.kinds == STATIC and forecast.expected == "reshard-refused"
    scalar = {"experts": ["scalar"]}
    env = {**_env("0.47.0"), FIX_PARTS_ENV_KEY: list(forecast.fix_parts)}
    save = StageResult(stage="save", ok=True, wall_s=1.0, environment=env,
                       rank_results={"0": {"amax_kinds": scalar}})
    load = _passed("0.47.0")
    load.environment = env
    rec = judge.judge_cell(_record(cell, "0.47.0"), cell.plan, save, load, decision=forecast)
    assert rec.amax_kinds == scalar and rec.forecast_disagreement, rec.notice
    assert (rec.expected, rec.outcome) == ("pass", "pass"), (rec.notice, rec.reason)


@pytest.mark.parametrize("load", ["tp1-etp1-ep2", "tp1-etp1-ep8"])
def test_the_second_bug_is_expected_only_where_a_rank_holds_more_than_one_expert(tmp_path, load):
    """Unpatched 0.47.0 on TE grouped experts drops every local expert's weight-quantizer amax
    but the first one's on reload (harness/check/expectation.py, docs/findings.md): a rank with
    one local expert loses nothing."""
    cell = _cell(tmp_path, "mtq:MAMBA_MOE_NVFP4_CONSERVATIVE_CFG", "tp1-etp1-ep4", load)
    local = cell.plan.num_experts // cell.load.ep
    d = decision_module.decide(cell.plan, "0.47.0", "0.19.2", {"experts": ["scalar"]})
    assert (d.expected == "amax-lost") == (local > 1), (local, d.expected, d.notice)
    if local == 1:
        assert d.expected == "pass", d.notice
