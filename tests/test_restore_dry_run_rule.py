"""ModelOpt's restore dry run on integer expert amax nothing has loaded yet: the
rule (harness/check/versions.py RESTORE_DRY_RUN), the expectation ``restore-dry-run`` and its
judging, cpu tier.

Every expected word below is derived from the source lines the rule cites, not from the harness:
- the restore makes each quantizer buffer with torch.empty (0.48.0rc1 nn/modules/
  tensor_quantizer.py:1364, 0.47.0 :1361); _QuantTEGroupedLinear.modelopt_post_restore
  (plugins/transformer_engine.py:173-233, both releases) runs wq_i(weight_i) (:207) for every
  member that has an _amax, before the checkpoint's values load, and re-raises a "device-side"
  error; the integer kernel asserts amax >= 0 (kernels/quantization/gemm/tensor_quant_gpu.cu:44;
  tensor_quant.py raises "Negative values in amax" without the extension);
- the members have an _amax there where the reset passes GroupedQuantizer by: 0.48.0rc1 itself
  (plugins/custom.py:180-186) and 0.47.0 with the fix's part (b) ("expert-amax"); unpatched
  0.47.0 resets them all and re-calibrates member 0 (custom.py:177-181): not reached;
- the fix's part (g) ("unloaded-amax", moe_ckpt_fix/unloaded_amax.py) zeroes every negative or
  NaN entry first: not reached;
- integer kinds only (per-channel, per-block: INT8_WEIGHT_ONLY_CFG, INT4_BLOCKWISE_WEIGHT_ONLY_CFG),
  routed experts only (the grouped linear's post-restore), TE backend only;
- every stage that restores ModelOpt's state meets it: a load, and the save's reference reload
  (harness/rank/stages.py: pp 1 or a CUDA tier, and patched or amax kept on reload), which comes
  after the save's own validation (a collision at the save comes first);
- nondeterministic: a stage that passes is judged by the expectation behind it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.check import decision as decision_module
from harness.check import judge, kinds, versions
from harness.check.rejudge import rejudge_record
from harness.check.results_file import read_results
from harness.check.versions import RESTORE_DRY_RUN, rules_for
from harness.model.recipes import EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL, SCALAR, SHARED_EXPERTS, STATIC_BLOCK
from harness.records import CauseKind, CellRecord, Expected, Outcome, StageCause, StageResult
from harness.scenario.scenarios import load_all
from harness.topology.topology import Topology

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "data" / "runs"
DRY = Expected.RESTORE_DRY_RUN
B, F, G = "expert-amax", "static-block", "unloaded-amax"
ASSERT = "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported"


# --- the rule ------------------------------------------------------------------------------------

@pytest.mark.parametrize("modelopt,parts,reached", [
    ("0.48.0rc1", (), True),  # custom.py:180-186 keeps the members' amax
    ("0.48.0rc1", (F,), True),
    ("0.48.0rc1", (G,), False),  # part (g)
    ("0.48.0rc1", (F, G), False),
    ("0.47.0", (), False),  # unpatched: every member reset, member 0 re-calibrated
    ("0.47.0", (F,), False),
    ("0.47.0", (B,), True),  # part (b) mirrors 0.48.0rc1
    ("0.47.0", (B, F), True),  # the 21:48 run's patched cells
    ("0.47.0", (B, F, G), False),
    ("0.47.0", (G,), False),
])
@pytest.mark.parametrize("mcore", ["0.19.2", "0.16.1"])
def test_the_integer_expert_kinds_carry_the_defect_where_the_members_keep_their_amax(modelopt, parts, reached, mcore):
    b = rules_for(modelopt, mcore)
    for kind in (PER_CHANNEL, PER_BLOCK):
        rule = b.kind_rule(kind, EXPERTS, parts)
        assert rule.restore_defect is (RESTORE_DRY_RUN if reached else None), (kind, parts)
        # nothing else of the kind's rule changes
        assert dataclasses.replace(rule, restore_defect=None) == dataclasses.replace(
            b.kinds[kind], restore_defect=None)
    for kind in (SCALAR, STATIC_BLOCK, NO_AMAX):  # not integer: no amax >= 0 assert
        assert b.kind_rule(kind, EXPERTS, parts).restore_defect is None
    for family in (SHARED_EXPERTS, OTHER):  # dense linears: no grouped dry run
        assert all(b.kind_rule(k, family, parts).restore_defect is None
                   for k in (SCALAR, PER_CHANNEL, PER_BLOCK, NO_AMAX))


def test_the_unpatched_rules_as_data():
    assert rules_for("0.48.0rc1", "0.19.2").kinds[PER_CHANNEL].restore_defect is RESTORE_DRY_RUN
    assert rules_for("0.48.0rc1", "0.19.2").kinds[PER_BLOCK].restore_defect is RESTORE_DRY_RUN
    assert rules_for("0.47.0", "0.19.2").kinds[PER_CHANNEL].restore_defect is None
    assert rules_for("0.47.0", "0.19.2").kinds[PER_BLOCK].restore_defect is None


def test_the_rule_cites_its_source_lines():
    src = RESTORE_DRY_RUN.source
    for line in ("transformer_engine.py:173-233", "tensor_quant_gpu.cu:44", "custom.py:180-186",
                 "tensor_quantizer.py", "part (g)"):
        assert line in src, line
    assert "transformer_engine.py:173-233" in RESTORE_DRY_RUN.finding
    assert RESTORE_DRY_RUN.seen(ASSERT) and RESTORE_DRY_RUN.seen("ValueError: Negative values in amax")
    assert not RESTORE_DRY_RUN.seen("CheckpointingException: Invalid access pattern")


# --- the expectation -----------------------------------------------------------------------------

def _scenario(name):
    return next(s for s in load_all() if s.name == name)


def _cells(name):
    return {c.id.split(",", 1)[1].rstrip("]"): c for c in _scenario(name).cells()}


@pytest.mark.parametrize("name", ["gpu-per-channel-recipe-witness", "gpu-per-block-recipe-witness"])
def test_every_cell_of_an_integer_witness_on_0_48_0rc1_expects_the_dry_run(name):
    """The save reloads its checkpoint (pp 1, 0.48.0rc1 keeps the amax on reload): the first stage
    that restores, before any load's reshard question."""
    for key, cell in _cells(name).items():
        d = decision_module.decide(cell.plan, "0.48.0rc1", "0.19.2")
        assert d.expected == DRY, key
        assert "nondeterministic" in d.notice and "RESTORE_DRY_RUN" in d.notice


def test_the_notice_names_the_expectation_behind_the_defect():
    cells = _cells("gpu-per-channel-recipe-witness")
    etp = decision_module.decide(cells["load=tp1-etp2-ep1-pp1"].plan, "0.48.0rc1", "0.19.2")
    assert etp.notice.endswith("judged as `reshard-refused`")  # the GPU-decided per-channel rule
    other_ep = decision_module.decide(cells["load=tp1-etp1-ep1-pp1"].plan, "0.48.0rc1", "0.19.2")
    assert other_ep.notice.endswith("judged as `pass`")


@pytest.mark.parametrize("name", ["gpu-per-channel-recipe-witness", "gpu-per-block-recipe-witness"])
def test_unpatched_0_47_0_never_meets_it(name):
    for cell in _cells(name).values():
        assert decision_module.decide(cell.plan, "0.47.0", "0.19.2").expected != DRY


@pytest.mark.parametrize("parts,word", [((B, F), DRY), ((B, F, G), Expected.PASS), ((G,), Expected.PASS)])
def test_the_patched_0_47_0_cell_by_the_parts_its_ranks_installed(parts, word):
    cell = _cells("gpu-per-channel-recipe")["save-only"]
    assert decision_module.decide(cell.plan, "0.47.0", "0.19.2", fix_parts=parts).expected == word


def test_only_te_grouped_experts_and_only_stages_that_restore():
    cell = _cells("gpu-per-channel-recipe-witness")["save-only"]
    rules = rules_for("0.48.0rc1", "0.19.2")
    from harness.check.expectation import expectation

    kinds = {EXPERTS: [PER_CHANNEL], SHARED_EXPERTS: [PER_CHANNEL], OTHER: [PER_CHANNEL]}
    assert expectation(cell.plan, rules, kinds)[0] == DRY
    local = dataclasses.replace(cell.plan, backend="local")
    assert expectation(local, rules, kinds)[0] == Expected.PASS
    # a save-only cell at pp 2 on the cpu tier measures no logits: no reload, no restore
    no_reload = dataclasses.replace(cell.plan, tier="cpu", save=Topology.parse("tp1-etp1-ep1-pp2"))
    assert expectation(no_reload, rules, kinds)[0] == Expected.PASS
    # ... but a load of it restores
    loaded = dataclasses.replace(no_reload, load=Topology.parse("tp1-etp1-ep1-pp2"))
    assert expectation(loaded, rules, kinds)[0] == DRY
    # dense families alone: nothing
    dense = {EXPERTS: [NO_AMAX], SHARED_EXPERTS: [PER_CHANNEL], OTHER: [PER_CHANNEL]}
    assert expectation(cell.plan, rules, dense)[0] == Expected.PASS


def test_a_collision_at_the_save_comes_before_its_reload():
    """0.47.0 + part (b): the fix's expert-TP rule, no collision; scalar experts beside integer ones
    at a TP != ETP save on 0.47.0 unpatched: the collision, and no dry run (unpatched 0.47.0)."""
    cell = _cells("gpu-per-channel-recipe-witness")["save-only"]
    from harness.check.expectation import expectation

    kinds = {EXPERTS: [PER_CHANNEL], SHARED_EXPERTS: [PER_CHANNEL], OTHER: [PER_CHANNEL]}
    at_tp2 = dataclasses.replace(cell.plan, save=Topology.parse("tp2-etp1-ep2-pp1"))
    assert expectation(at_tp2, rules_for("0.47.0", "0.19.2"), kinds)[0] == Expected.FAIL_SAVE
    assert expectation(at_tp2, rules_for("0.48.0rc1", "0.19.2"), kinds)[0] == DRY


# --- the judge -----------------------------------------------------------------------------------

ENV = {"nvidia-modelopt": "0.48.0rc1", "megatron-core": "0.19.2"}


def _rec(cell) -> CellRecord:
    return CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                      save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
                      patch="none", expected="", modelopt="0.48.0rc1", mcore="0.19.2",
                      recipe=cell.scenario.recipe)


def _failed(stage: str, exc: str, message: str, timed_out: bool = False) -> StageResult:
    cause = StageCause(rank=0, kind=CauseKind.EXCEPTION, exc_type=exc, message=message, key=None)
    return StageResult(stage=stage, ok=False, wall_s=20.0, cause=cause, environment=ENV,
                       timed_out=timed_out)


def _passed(stage: str) -> StageResult:
    ranks = {"0": {"verify": {}}} if stage == "load" else {}
    return StageResult(stage=stage, ok=True, wall_s=1.0, environment=ENV, rank_results=ranks)


@pytest.mark.parametrize("exc,message", [("torch.AcceleratorError", ASSERT),
                                         ("ValueError", "Negative values in amax")])
def test_a_save_that_dies_of_it_is_a_known_refusal_and_blocks_its_loads(exc, message):
    cells = _cells("gpu-per-block-recipe-witness")
    save_only, load = cells["save-only"], cells["load=tp1-etp2-ep1-pp1"]
    rec = judge.judge_cell(_rec(save_only), save_only.plan, _failed("save", exc, message), None)
    assert (rec.expected, rec.outcome, rec.failed_stage) == (DRY, Outcome.KNOWN_REFUSAL, "save")
    assert rec.reason == RESTORE_DRY_RUN.finding
    rec = judge.judge_cell(_rec(load), load.plan, _failed("save", exc, message), None)
    assert (rec.expected, rec.outcome, rec.failed_stage) == (DRY, Outcome.KNOWN_REFUSAL, "save")
    assert rec.reason.startswith(f"blocked by the save at {load.save.id}")
    assert "transformer_engine.py:173-233" in rec.reason


def test_a_load_that_dies_of_it_is_a_known_refusal():
    cell = _cells("gpu-per-channel-recipe-witness")["load=tp1-etp1-ep1-pp1"]
    rec = judge.judge_cell(_rec(cell), cell.plan, _passed("save"),
                           _failed("load", "torch.AcceleratorError", ASSERT))
    assert (rec.outcome, rec.failed_stage, rec.reason) == (Outcome.KNOWN_REFUSAL, "load", RESTORE_DRY_RUN.finding)


def test_a_stage_that_passes_is_judged_by_the_expectation_behind_it():
    cells = _cells("gpu-per-channel-recipe-witness")
    save_only = cells["save-only"]
    rec = judge.judge_cell(_rec(save_only), save_only.plan, _passed("save"), None)
    assert (rec.expected, rec.outcome) == (Expected.PASS, Outcome.PASS)
    assert "restore-dry-run was expected first" in rec.notice and "nondeterministic" in rec.notice
    other_ep = cells["load=tp1-etp1-ep1-pp1"]
    rec = judge.judge_cell(_rec(other_ep), other_ep.plan, _passed("save"), _passed("load"))
    assert (rec.expected, rec.outcome) == (Expected.PASS, Outcome.PASS)
    etp = cells["load=tp1-etp2-ep1-pp1"]  # behind it the per-channel refusal at another ETP
    rec = judge.judge_cell(_rec(etp), etp.plan, _passed("save"), _passed("load"))
    assert (rec.expected, rec.outcome) == (Expected.RESHARD_REFUSED, Outcome.UNEXPECTED_PASS)


def test_any_other_failure_stays_unexpected():
    cells = _cells("gpu-per-channel-recipe-witness")
    save_only, other_ep = cells["save-only"], cells["load=tp1-etp1-ep1-pp1"]
    boom = _failed("save", "RuntimeError", "something else entirely")
    assert judge.judge_cell(_rec(save_only), save_only.plan, boom, None).outcome == Outcome.UNEXPECTED_FAILURE
    assert judge.judge_cell(_rec(other_ep), other_ep.plan, boom, None).outcome == Outcome.UNEXPECTED_FAILURE
    late = _failed("load", "RuntimeError", "something else entirely")
    assert judge.judge_cell(_rec(other_ep), other_ep.plan, _passed("save"), late).outcome == Outcome.UNEXPECTED_FAILURE
    slow = _failed("save", "torch.AcceleratorError", ASSERT, timed_out=True)
    assert judge.judge_cell(_rec(save_only), save_only.plan, slow, None).outcome == Outcome.UNEXPECTED_FAILURE


def test_part_g_makes_the_assert_unexpected():
    """Under the fix with part (g) the defect is absent: the same assert is an unexpected failure."""
    cell = _cells("gpu-per-channel-recipe")["save-only"]
    env = {**ENV, "nvidia-modelopt": "0.47.0", "moe-ckpt-fix-parts": [B, F, G]}
    save = dataclasses.replace(_failed("save", "torch.AcceleratorError", ASSERT), environment=env)
    rec = dataclasses.replace(_rec(cell), patch="fix", modelopt="0.47.0")
    got = judge.judge_cell(rec, cell.plan, save, None)
    assert (got.expected, got.outcome) == (Expected.PASS, Outcome.UNEXPECTED_FAILURE)


# --- the committed records of the 21:48 GPU run --------------------------------------------------

RECORDS = ("20261206-215208-recipes-0.47.0-fix", "20261206-215246-recipes-0.48.0rc1-none")


@pytest.mark.parametrize("run", RECORDS)
def test_the_committed_integer_cells_become_known_refusals(run):
    cells = {c.id: c for s in load_all() for c in s.cells()}
    doc = read_results(RUNS / f"{run}.results.json")
    integer = no_amax = 0
    for raw in doc["cells"]:
        from harness.report.verdict import with_pair

        cell = cells[raw["cell_id"]]
        new = CellRecord.from_json(rejudge_record(with_pair(CellRecord.of(raw)), cell.plan))
        if "no-amax" in raw["scenario"]:
            no_amax += 1
            assert (raw["outcome"], new.outcome) == ("pass", Outcome.PASS)
            continue
        integer += 1
        assert raw["outcome"] in ("unexpected-failure", "rule-unknown")
        assert (new.expected, new.outcome, new.failed_stage) == (DRY, Outcome.KNOWN_REFUSAL, "save")
        if cell.load is None:
            assert new.reason == RESTORE_DRY_RUN.finding
        else:
            assert new.reason.startswith(f"blocked by the save at {cell.save.id}, whose reload")
    assert (integer, no_amax) == (8, 4)


def test_the_save_stage_and_the_expectation_share_the_reload_rule():
    """harness/rank/stages.py decides its reference reload by versions.reload_keeps_state and
    versions.measures_logits, which the expectation reads (versions.reference_reload)."""
    src = (ROOT / "harness" / "rank" / "stages.py").read_text()
    assert "reload_keeps_state(" in src and "measures_logits(" in src
    assert kinds.reference_reload(False, False, [rules_for("0.48.0rc1", "0.19.2").kinds[PER_CHANNEL]], 1, True)
    assert not kinds.reference_reload(False, False, [rules_for("0.47.0", "0.19.2").kinds[PER_CHANNEL]], 1, True)
    assert not kinds.reference_reload(True, False, [], 2, False)
