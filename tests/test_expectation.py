"""The expectation rule (harness/check/expectation.py) as a unit, where the mutation run over it
(docs/mutation.md) found a branch no other test pins: the one line saying why no amax kind is
known (which release's matching, on which families), and ``expected`` before a save, which the
fix's parts the scenario asks for decide. Pure: plans are built here, no rank starts."""
from __future__ import annotations

import dataclasses

import pytest

from harness.check import expectation as exp
from harness.check.matching import matched
from harness.check.plan import CellPlan
from harness.check.versions import rules_for
from harness.model.recipes import EXPERTS, OTHER
from harness.records import Expected, Patch
from harness.topology.topology import Topology

pytestmark = pytest.mark.cpu

NO_PTQ = "modelopt:general/auto_quantize/nvfp4_fp8_at_5p4bits"  # 0.47.0: no quantize section
BLOCKWISE = "modelopt:general/ptq/int4_blockwise_weight_only"  # no catalogue forecast; 0.47.0 matches it


def _plan(**kw) -> CellPlan:
    base = dict(id="c", scenario="s", tier="gpu-shared", backend="te", patch=Patch.NONE,
                recipe=NO_PTQ, expect="oracle", save=Topology.parse("tp1-etp1-ep2-pp1"),
                load=Topology.parse("tp1-etp1-ep1-pp1"), num_experts=4, families=(EXPERTS, OTHER))
    base.update(kw)
    return CellPlan(**base)


def _line(recipe: str, told: str) -> str:
    return (f"recipe {recipe}: no amax kinds of the routed experts known: no save recorded them, "
            f"harness/check/recipes.py has no forecast, and {told}: nothing to judge them by")


@pytest.mark.parametrize("modelopt", ["0.47.0", "0.48.0rc1"])
def test_no_kinds_why_tells_what_the_given_releases_matching_says(modelopt):
    plan = _plan()
    told = matched(NO_PTQ, modelopt, plan.families).why
    assert f"ModelOpt {modelopt}" in told
    assert exp.no_kinds_why(plan, modelopt) == _line(NO_PTQ, told)


def test_no_kinds_why_reads_the_plans_families():
    """0.47.0's matching gives the recipe's experts a kind, but a model without routed-expert
    modules in its families has none of them: the line says so."""
    plan = _plan(recipe=BLOCKWISE, families=(OTHER,))
    assert matched(BLOCKWISE, "0.47.0").kinds[EXPERTS]
    assert exp.no_kinds_why(plan, "0.47.0") == _line(
        BLOCKWISE, "ModelOpt 0.47.0's own matching gives the routed experts no kind: it configures "
                   "no routed-expert weight quantizer (harness/check/forecasts/modelopt-0.47.0.json, "
                   "written by `python -m harness recipes`)")


def test_no_kinds_is_rule_unknown_with_that_line():
    plan = _plan()
    assert exp.expectation(plan, rules_for("0.47.0", "0.19.2"), None, modelopt="0.48.0rc1") == (
        Expected.RULE_UNKNOWN, exp.no_kinds_why(plan, "0.48.0rc1"))


def test_expected_before_a_save_follows_the_fix_parts_the_scenario_asks_for():
    """0.47.0 patched with part (b) keeps the integer members' amax, so the save's reference
    reload meets the restore's dry run (harness/check/versions.py RESTORE_DRY_RUN); the whole
    fix with part (g) zeroes what it would read."""
    plan = _plan(recipe="mtq:INT8_WEIGHT_ONLY_CFG", patch=Patch.FIX, load=None)
    behaviour = rules_for("0.47.0", "0.19.2")
    with_b = dataclasses.replace(plan, fix_parts=("expert-amax",))
    assert exp.expected(with_b, behaviour) == Expected.RESTORE_DRY_RUN
    assert exp.expected(plan, behaviour) != Expected.RESTORE_DRY_RUN


@pytest.mark.parametrize("recipe", ["mtq:INT8_WEIGHT_ONLY_CFG", BLOCKWISE])
def test_the_kinds_that_decide_are_those_on_the_plans_families(recipe):
    """The catalogue's forecast, else 0.47.0's own matching, on the model's families only: a
    family the model has not got decides nothing."""
    only_experts = _plan(recipe=recipe, families=(EXPERTS,))
    kinds = exp.kinds_for(only_experts, None, "0.47.0")
    assert set(kinds) == {EXPERTS}, kinds
    assert set(exp.kinds_for(_plan(recipe=recipe), None, "0.47.0")) == {EXPERTS, OTHER}
    recorded = {EXPERTS: ["scalar"]}
    assert exp.kinds_for(only_experts, recorded, "0.47.0") is recorded


@pytest.mark.parametrize("tier,pp,word", [
    ("cpu", 1, Expected.RESTORE_DRY_RUN),  # pp 1 measures logits anywhere: the reload restores
    ("gpu-shared", 2, Expected.RESTORE_DRY_RUN),  # pp 2 measures them on CUDA only
    ("cpu", 2, Expected.PASS),  # no logits, no reference reload, nothing restores
])
def test_a_save_only_cell_meets_the_dry_run_where_its_save_reloads(tier, pp, word):
    plan = _plan(recipe="mtq:INT8_WEIGHT_ONLY_CFG", tier=tier, load=None,
                 save=Topology.parse(f"tp1-etp1-ep1-pp{pp}"))
    assert exp.expected(plan, rules_for("0.48.0rc1", "0.19.2")) == word


# --- branches of ``expectation`` the first mutation run left untested --------------------------

SCALAR_KINDS = {EXPERTS: ["scalar"], OTHER: ["scalar"]}
INT_KINDS = {EXPERTS: ["per-channel"], OTHER: ["per-channel"]}


def test_fix_parts_count_only_where_the_cell_is_patched():
    """Unpatched, the parts given install nothing: 0.47.0 resets the members' amax (no dry run
    at the load, where part (b) would keep them)."""
    plan = _plan()
    b = rules_for("0.47.0", "0.19.2")
    assert exp.expectation(plan, b, INT_KINDS, ("expert-amax",)) == exp.expectation(plan, b, INT_KINDS)
    assert exp.expectation(plan, b, INT_KINDS)[0] != Expected.RESTORE_DRY_RUN
    patched = _plan(patch=Patch.FIX)
    assert exp.expectation(patched, b, INT_KINDS, ("expert-amax",))[0] == Expected.RESTORE_DRY_RUN


def test_a_pair_that_cannot_save_fails_the_save_or_a_goldens_load(tmp_path):
    b = rules_for("0.48.0rc1", "0.15.3")
    assert b.cannot_save
    assert exp.expectation(_plan(), b, SCALAR_KINDS)[0] == Expected.FAIL_SAVE
    golden = _plan(golden="g", golden_ckpt=tmp_path)
    assert exp.expectation(golden, b, SCALAR_KINDS)[0] == Expected.FAIL_LOAD


def test_an_unpatched_golden_whose_layout_is_not_restored():
    from harness.check.layouts import GoldenLayout

    b = rules_for("0.48.0rc1", "0.19.2")
    shared = _plan(golden="g", golden_layout=GoldenLayout.SHARED)
    assert exp.expectation(shared, b, SCALAR_KINDS)[0] == Expected.NOT_RESTORED
    complete = _plan(golden="g", golden_layout=GoldenLayout.COMPLETE)
    assert exp.expectation(complete, b, SCALAR_KINDS)[0] == Expected.PASS


def test_the_shared_input_quantizer_rule_is_the_te_backends_only():
    """megatron-core 0.15's decorator gives the grouped linear's shared input_quantizer amax
    expert-TP replica ids (collides whenever TP > ETP): TE's grouped linear only."""
    b = rules_for("0.47.0", "0.15.3")
    assert b.shared_rule == "expert-tp-dense-dp"
    save = Topology.parse("tp2-etp1-ep2-pp1")
    assert exp.expectation(_plan(save=save, load=None), b, SCALAR_KINDS)[0] == Expected.FAIL_SAVE
    local = _plan(save=save, load=None, backend="local")
    assert exp.expectation(local, b, SCALAR_KINDS)[0] != Expected.FAIL_SAVE


def test_each_familys_kind_reshards_at_a_change_of_its_own_split():
    """Routed experts are split over expert TP: at a TP change with the same ETP their
    per-channel amax is not resharded (the dense families' per-channel one reshards and passes)."""
    b = rules_for("0.48.0rc1", "0.19.2")
    tp_change = _plan(save=Topology.parse("tp2-etp1-ep2-pp1"), load=Topology.parse("tp2-etp1-ep1-pp1"))
    assert exp.expectation(tp_change, b, INT_KINDS, restore_defects=False)[0] == Expected.PASS
    etp_change = _plan(save=Topology.parse("tp1-etp1-ep2-pp1"), load=Topology.parse("tp1-etp2-ep1-pp1"))
    assert exp.expectation(etp_change, b, INT_KINDS, restore_defects=False)[0] == Expected.RESHARD_REFUSED


@pytest.mark.parametrize("ep,word", [(1, Expected.AMAX_LOST), (2, Expected.AMAX_LOST), (4, Expected.PASS)])
def test_the_second_bug_needs_more_than_one_expert_per_load_rank(ep, word):
    """Unpatched 0.47.0 on TEGroupedMLP: every local expert's amax but expert 0's is gone."""
    plan = _plan(load=Topology.parse(f"tp1-etp1-ep{ep}-pp1"))
    assert plan.num_experts == 4
    assert exp.expectation(plan, rules_for("0.47.0", "0.19.2"), SCALAR_KINDS)[0] == word
