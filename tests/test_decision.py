"""A cell's decision (harness/check/decision.py) as a unit: ``decide`` works under the pair it is
given and never under the installed one, and ``version_skip_reason`` skips a cell for exactly
the reasons it names (the fix not written for the pair, the cpu tier without the plugin a pair
needs, a golden this megatron-core cannot read). Pure: no rank starts; the plans are built here.
The mutation run over decision.py (docs/mutation.md) found these branches untested."""
from __future__ import annotations

import pytest

from harness import paths
from harness.check import decision, expectation, versions
from harness.check.defects import COMMON_PT
from harness.check.plan import CellPlan
from harness.check.recipes import forecast
from harness.check.versions import rules_for
from harness.fix import SUPPORTED_MCORE_VERSIONS, SUPPORTED_MODELOPT_VERSION
from harness.model.recipes import DEFAULT_RECIPE, EXPERTS, OTHER, SCALAR
from harness.records import Expected, Patch
from harness.topology.topology import Topology

pytestmark = pytest.mark.cpu

SAVE, LOAD = Topology.parse("tp1-etp1-ep2-pp1"), Topology.parse("tp1-etp1-ep1-pp1")


def _plan(**kw) -> CellPlan:
    base = dict(id="c", scenario="s", tier="gpu-shared", backend="te", patch=Patch.NONE,
                recipe=DEFAULT_RECIPE, expect="oracle", save=SAVE, load=LOAD, num_experts=4,
                families=(EXPERTS, OTHER))
    base.update(kw)
    return CellPlan(**base)


@pytest.fixture
def no_installed_versions(monkeypatch):
    """Reading the installed versions fails the test: ``decide`` was given the pair."""
    def refuse():
        raise AssertionError("the installed version was read although the pair was given")
    for module in (decision, expectation, versions):
        for name in ("installed_mcore", "installed_modelopt"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("plan", [
    _plan(),
    # no catalogue forecast: ModelOpt's own matching of the release given (none computed for
    # 0.48.0rc1 here) decides, and the rule-unknown line names that release
    _plan(recipe="modelopt:general/ptq/int4_blockwise_weight_only"),
    _plan(mtp_num_layers=1, position_embedding="learned_absolute", load=Topology.parse("tp1-etp1-ep1-pp2")),
    _plan(patch=Patch.FIX),
], ids=["default", "no-forecast", "mtp-defect", "fix"])
@pytest.mark.parametrize("modelopt,mcore", [("0.48.0rc1", "0.16.1"), ("99.0", "0.19.2")])
def test_decide_reads_only_the_pair_it_is_given(no_installed_versions, plan, modelopt, mcore):
    d = decision.decide(plan, modelopt, mcore)
    assert (d.modelopt, d.mcore) == (modelopt, mcore)
    if not rules_for(modelopt, mcore).known:
        assert d.expected == Expected.RULE_UNKNOWN and f"nvidia-modelopt {modelopt}," in d.notice
    if plan.patch == Patch.FIX and d.skip:
        assert f"{modelopt} is installed with megatron-core {mcore}" in d.skip


def test_no_forecast_is_matched_by_the_release_given():
    """kinds_for and the rule-unknown line use the ModelOpt given: 0.47.0's matching gives the
    recipe's experts a kind, no matching of 0.46.1 was computed (no forecast file of it)."""
    plan = _plan(recipe="modelopt:general/ptq/int4_blockwise_weight_only")
    assert decision.decide(plan, "0.47.0", "0.19.2").kinds[EXPERTS]
    unknown = decision.decide(plan, "0.46.1", "0.19.2")
    assert unknown.kinds is None and unknown.expected == Expected.RULE_UNKNOWN
    assert "ModelOpt 0.46.1" in unknown.notice, unknown.notice


def test_the_mtp_defect_is_covered_by_the_megatron_core_given():
    plan = _plan(mtp_num_layers=1, position_embedding="learned_absolute",
                 load=Topology.parse("tp1-etp1-ep1-pp2"))
    assert decision.decide(plan, "0.48.0rc1", "0.19.2").expected == Expected.MTP_EMBEDDING_REFUSED
    assert decision.decide(plan, "0.48.0rc1", "0.16.1").expected == Expected.RULE_UNKNOWN


def test_no_defect_behind_where_the_expectation_is_no_dry_run():
    d = decision.decide(_plan(), "0.47.0", "0.19.2")
    assert d.expected != Expected.RESTORE_DRY_RUN
    assert d.behind is None and d.behind_notice is None


def test_holds_for_compares_the_fix_parts():
    d = decision.decide(_plan(), "0.47.0", "0.19.2")
    assert d.fix_parts == ()
    assert d.holds_for("0.47.0", "0.19.2", None)
    assert d.holds_for("0.47.0", "0.19.2", None, fix_parts=())
    assert not d.holds_for("0.47.0", "0.19.2", None, fix_parts=("static-block",))
    assert not d.holds_for("0.47.0", "0.16.1", None)
    assert not d.holds_for("0.47.0", "0.19.2", {EXPERTS: ["other"]})


def test_the_disagreement_names_the_plans_recipe_and_reads_its_families():
    """The forecast is the recipe's on the plan's families: a recorded family the model has not
    got is something the forecast does not say, so the save disagrees with it."""
    recipe = "mtq:INT8_WEIGHT_ONLY_CFG"  # not the default recipe, which a missing one reads as
    assert recipe != DEFAULT_RECIPE
    assert forecast(recipe) is None  # not hand-kept: ModelOpt's own matching forecasts it
    full = decision.forecast_kinds(_plan(recipe=recipe), "0.47.0")
    assert OTHER in full
    d = decision.decide(_plan(recipe=recipe, families=(EXPERTS,)), "0.47.0", "0.19.2", recorded=full)
    assert d.forecast_disagreement and d.forecast_disagreement.startswith(f"recipe {recipe}:")
    recorded = {EXPERTS: [SCALAR, "x"]}
    d = decision.decide(_plan(recipe=recipe), "0.47.0", "0.19.2", recorded=recorded)
    assert d.forecast_disagreement.startswith(f"recipe {recipe}:"), d.forecast_disagreement


# --- version_skip_reason -------------------------------------------------------------------------

def test_the_fix_not_written_for_the_pair_skips_with_its_line():
    plan = _plan(patch=Patch.FIX)
    behaviour = rules_for("0.48.0rc1", "0.16.1")
    assert not behaviour.fix_runs(plan.fix_parts)
    assert decision.version_skip_reason(plan, behaviour, "0.48.0rc1", "0.16.1") == (
        f"harness.fix is written for nvidia-modelopt {SUPPORTED_MODELOPT_VERSION} only, with "
        f"megatron-core {'/'.join(SUPPORTED_MCORE_VERSIONS)}; 0.48.0rc1 is installed with "
        "megatron-core 0.16.1 (a fixed release needs no patch: see the unpatched scenarios)")


def test_the_fix_parts_a_release_lacks_run_there():
    """0.48.0rc1 lacks only part (f): a scenario needing that part alone is not skipped."""
    behaviour = rules_for("0.48.0rc1", "0.19.2")
    plan = _plan(patch=Patch.FIX, fix_parts=("static-block",))
    assert behaviour.fix_runs(plan.fix_parts)
    assert decision.version_skip_reason(plan, behaviour, "0.48.0rc1", "0.19.2") is None


@pytest.fixture
def plugin(monkeypatch):
    monkeypatch.setattr(decision, "plugin_problem", lambda: "the plugin does not import")


@pytest.mark.parametrize("tier,modelopt,skipped", [
    ("cpu", "0.47.0", False),  # known, no Transformer Engine needed
    ("cpu", "0.48.0rc1", True),  # its plugin needs Transformer Engine
    ("cpu", "99.0", True),  # no rule: nothing known of its plugin
    ("gpu-shared", "0.48.0rc1", False),  # CUDA tier: Transformer Engine is there
    ("gpu-shared", "99.0", False),
])
def test_the_cpu_tier_skips_a_pair_whose_plugin_it_cannot_import(plugin, tier, modelopt, skipped):
    behaviour = rules_for(modelopt, "0.19.2")
    got = decision.version_skip_reason(_plan(tier=tier), behaviour, modelopt, "0.19.2")
    assert got == ("the plugin does not import" if skipped else None)


@pytest.mark.parametrize("mcore,common_pt,skipped", [
    ("0.16.1", False, True),  # needs a common.pt the golden has not got
    ("0.16.1", True, False),
    ("0.19.2", False, False),  # reads the golden without one
])
def test_a_golden_this_megatron_core_cannot_read_is_skipped(monkeypatch, tmp_path, mcore, common_pt, skipped):
    monkeypatch.setattr(paths, "shown_path", lambda p: f"<shown {p.name}>")
    ckpt = tmp_path / "golden-ckpt"
    ckpt.mkdir()
    if common_pt:
        (ckpt / COMMON_PT).write_bytes(b"")
    plan = _plan(golden="g", golden_ckpt=ckpt, tier="gpu-shared")
    got = decision.version_skip_reason(plan, rules_for("0.47.0", mcore), "0.47.0", mcore)
    if not skipped:
        assert got is None
        return
    assert got.startswith(f"golden not loadable here: <shown golden-ckpt>: no {COMMON_PT}: "
                          f"megatron-core {mcore} reads only"), got


def _golden_mtp_plan(ckpt) -> CellPlan:
    """A golden of integer experts (the restore's dry run at its load, which comes first) loaded
    at pp 2 by an MTP model with a learned absolute position embedding (megatron-core's own
    refusal at that load, read for 0.19.2 only)."""
    from harness.check.layouts import GoldenLayout

    return _plan(recipe="mtq:INT8_WEIGHT_ONLY_CFG", golden="g", golden_ckpt=ckpt,
                 golden_layout=GoldenLayout.COMPLETE,
                 mtp_num_layers=1, position_embedding="learned_absolute",
                 load=Topology.parse("tp1-etp1-ep1-pp2"))


def test_the_expectation_behind_the_dry_run_is_worked_out_under_the_pair_given(no_installed_versions, tmp_path):
    plan = _golden_mtp_plan(tmp_path)
    covered = decision.decide(plan, "0.48.0rc1", "0.19.2")
    assert (covered.expected, covered.behind, covered.behind_notice) == (
        Expected.RESTORE_DRY_RUN, Expected.MTP_EMBEDDING_REFUSED, None)
    assert covered.notice.endswith("where it passes the cell is judged as `mtp-embedding-refused`")
    assert ("(harness/check/versions.py RESTORE_DRY_RUN): nondeterministic, a stage that restores "
            "may die of it (known-refusal) or pass; where it passes") in covered.notice
    # a megatron-core not read for the MTP refusal: behind the dry run, nothing is predicted,
    # and the notice carries that line
    unread = decision.decide(plan, "0.48.0rc1", "0.16.1")
    assert (unread.expected, unread.behind) == (Expected.RESTORE_DRY_RUN, Expected.RULE_UNKNOWN)
    assert unread.behind_notice and "megatron-core 0.16.1" in unread.behind_notice
    assert unread.notice.endswith(f"judged as `rule-unknown`: {unread.behind_notice}")


def test_the_decision_keeps_the_fix_parts_that_decided():
    plan = _plan(patch=Patch.FIX, fix_parts=("static-block",))
    assert decision.decide(plan, "0.47.0", "0.19.2").fix_parts == ("static-block",)
    assert decision.decide(plan, "0.47.0", "0.19.2", fix_parts=["expert-amax"]).fix_parts == ("expert-amax",)
