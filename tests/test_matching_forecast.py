"""A record with no amax kinds is judged by the forecast of ModelOpt's own matching.

Why: a save whose stage died before its ranks recorded the kinds (before calibration ended, or a
record written before ranks recorded kinds at all) still has a recipe, and the installed ModelOpt's
own matching (harness/rank/recipe_survey.py ``configured_kinds``, what ``python -m harness recipes``
computes and writes per release: harness/check/matching.py) says what that recipe configures.
Without it, a recipe the hand catalogue (harness/check/recipes.py) lacks was ``rule-unknown``
wherever its save failed, the collision included.

The forecasts here come from a fresh run of the survey in a process of its own, never from the
harness's earlier output. The expectations come from the rules of 0.47.0 (harness/check/
versions.py): its dense-TP replica ids give every per-expert weight-quantizer amax no main replica
at TP 2 > ETP 1, so the save collides on a scalar ``_amax``.
"""
from __future__ import annotations

import pytest

from harness.check import judge, matching
from harness.check.recipes import recipe_facts
from harness.check.versions import installed_modelopt
from harness.records import CauseKind, CellRecord, Expected, Outcome, StageCause, StageResult
from harness.scenario.scenarios import load_scenario

pytestmark = pytest.mark.cpu

# In ModelOpt's library, not in the hand catalogue: NVFP4 on the routed experts only (scalar),
# and a KV-cache recipe that quantizes no weight of the experts.
EXPERTS_ONLY = "mtq:NVFP4_EXPERTS_ONLY_CFG"
KV_ONLY = "mtq:NVFP4_KV_CFG"
SAVE = "tp2-etp1-ep2"
KEY = "decoder.layers.0.mlp.experts.experts.1.linear_fc1.weight_quantizer._amax"


@pytest.fixture(scope="module")
def survey():
    from harness.rank.recipe_survey import in_own_process

    return in_own_process([EXPERTS_ONLY, KV_ONLY], forecast_only=True, timeout_s=600)


@pytest.fixture
def forecasts(survey, tmp_path, monkeypatch):
    """The fresh survey as the forecast file of the installed release, in a folder of the test's."""
    monkeypatch.setattr(matching, "FORECAST_DIR", tmp_path / "forecasts")
    matching.write(survey)
    return survey


def _cell(tmp_path, recipe, load=True):
    path = tmp_path / "mine.toml"
    path.write_text('tier = "gpu-shared"\nbackend = "te"\nexpect = "oracle"\npatch = "none"\n'
                    f'recipe = "{recipe}"\nsaves = ["{SAVE}"]\nloads = ["tp1-etp1-ep2"]\n')
    return next(c for c in load_scenario(path).cells() if (c.load is not None) == load)


def _record(cell, modelopt) -> CellRecord:
    return CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                      save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
                      patch="none", expected="", modelopt=modelopt, mcore="0.19.2",
                      recipe=cell.scenario.recipe)


def _collided_save(modelopt) -> StageResult:
    """The save as it failed on the GPU: megatron-core's validation on the expert amax; no rank
    recorded kinds."""
    cause = StageCause(rank=0, kind=CauseKind.EXCEPTION,
                       exc_type="megatron.core.dist_checkpointing.core.CheckpointingException",
                       message=f"Invalid access pattern for ShardedTensor(key='{KEY}', ...)", key=KEY)
    return StageResult(stage="save", ok=False, wall_s=1.0, cause=cause,
                       environment={"nvidia-modelopt": modelopt, "megatron-core": "0.19.2"})


@pytest.mark.slow  # a second real survey; tests/test_recipe_survey.py runs one
def test_the_survey_gives_the_experts_only_recipe_scalar_experts_and_the_kv_recipe_none(survey):
    rows = {r["recipe"]: r for r in survey["rows"]}
    assert recipe_facts(EXPERTS_ONLY) is None and recipe_facts(KV_ONLY) is None  # not hand-kept
    assert rows[EXPERTS_ONLY]["forecast"]["experts"] == ["scalar"]
    assert "forecast" not in rows[KV_ONLY], rows[KV_ONLY]


def test_a_failed_save_with_no_kinds_is_judged_by_modelopt_s_matching(tmp_path, forecasts):
    modelopt = installed_modelopt()
    assert modelopt == "0.47.0" or pytest.skip(f"the rules used here are 0.47.0's; {modelopt} installed")
    save_only, load = _cell(tmp_path, EXPERTS_ONLY, load=False), _cell(tmp_path, EXPERTS_ONLY)
    rec = judge.judge_cell(_record(save_only, modelopt), save_only.plan, _collided_save(modelopt), None)
    assert rec.amax_kinds is None  # nothing recorded: the forecast decided
    assert (rec.expected, rec.outcome) == (Expected.FAIL_SAVE, Outcome.BUG_REPRODUCED), (rec.notice, rec.reason)
    rec = judge.judge_cell(_record(load, modelopt), load.plan, _collided_save(modelopt), None)
    assert (rec.expected, rec.outcome) == (Expected.FAIL_SAVE, Outcome.BLOCKED), (rec.notice, rec.reason)


def test_a_recipe_modelopt_gives_no_expert_kind_stays_rule_unknown_and_says_why(tmp_path, forecasts):
    modelopt = installed_modelopt()
    cell = _cell(tmp_path, KV_ONLY, load=False)
    rec = judge.judge_cell(_record(cell, modelopt), cell.plan, _collided_save(modelopt), None)
    assert rec.outcome == Outcome.RULE_UNKNOWN
    assert "own matching gives the routed experts no kind" in rec.reason, rec.reason
    assert "quantizes no routed-expert weight" in rec.reason and KV_ONLY in rec.reason


def test_a_release_whose_matching_was_not_computed_says_so(tmp_path, monkeypatch):
    """No forecast file for the release that ran: no kinds, and the reason names the release
    whose matching is missing and the command that computes it."""
    monkeypatch.setattr(matching, "FORECAST_DIR", tmp_path / "none")
    modelopt = installed_modelopt()
    cell = _cell(tmp_path, EXPERTS_ONLY, load=False)
    rec = judge.judge_cell(_record(cell, modelopt), cell.plan, _collided_save(modelopt), None)
    assert rec.outcome == Outcome.RULE_UNKNOWN
    assert f"ModelOpt {modelopt}'s own matching was not computed here" in rec.reason, rec.reason
    assert matching.MAKER in rec.reason


@pytest.mark.slow  # a real survey; tests/test_recipe_survey.py runs one
def test_the_committed_forecast_of_the_installed_release_is_modelopt_s_matching(survey):
    """The file the judge reads for the installed release says what a fresh survey says."""
    path = matching.forecast_file(survey["modelopt"])
    assert path.exists(), f"no {path.name}: run `python -m harness recipes`"
    for row in survey["rows"]:
        got = matching.matched(row["recipe"], survey["modelopt"])
        assert got.kinds == row.get("forecast"), (row, got)
