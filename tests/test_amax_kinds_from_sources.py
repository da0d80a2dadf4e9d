"""The per-channel, per-block and no-amax amax kinds, their rules (read from the
sources only, harness/check/versions.py) and what they predict for every cell of the scenarios
that check them on a GPU (scenarios/gpu_{per_channel,per_block,no_amax}_recipe*.toml, queue
tools/gpu-host/queues/amax-kinds.txt).

Each expected word below is derived from the source lines the rules cite, not from the harness:
- 0.47.0 builds every per-expert weight_quantizer entry with no groups (plugins/megatron.py:936),
  so megatron-core 0.19.2 uses the DENSE TP group (transformer/utils.py:131-133): a replicated
  entry (linear_fc2's per-channel amax, Row with an int axis: no shard axis, :616) gets
  replica_id (0, dense tp rank, edp) (core/utils.py:1149-1150) -> TP != ETP: "Invalid access
  pattern" at the save or the load (fail-load for a TP 1 save loaded at TP 2 or ETP 2);
- 0.47.0 custom.py:177-181 resets a GroupedQuantizer and re-calibrates member 0 only: every
  load rank holding more than one expert loses the others' amax (amax-lost), for any kind that
  has an _amax but is not complete static NVFP4;
- 0.48.0rc1 builds them on the expert groups (:983-989) and skips GroupedQuantizer in the reset
  (custom.py:180-186): same-ETP loads and TP changes pass;
- an ETP change of a channel- or block-shaped expert amax depends on a GPU-only dry run
  (transformer_engine.py:205-233, tensor_quant.cpp:58), decided on the GPU (23:40 session,
  docs/findings.md "Integer amax at another TP"): a per-channel one is refused (global shape
  mismatch: reshard-refused), a per-block one re-calibrated and loads (pass);
- a dense per-channel amax is re-calibrated to the load's local shape before the load
  (custom.py:177-181) and cut over TP like its weight (Column axis 0): a TP change passes; a
  dense per-block one is refused at another TP (the GPU: the Row entry keeps the save's shape,
  reshard-refused); dense static NVFP4 blocks load at another TP (the GPU: pass);
- MX formats hold no _amax and the sharded state dict takes only _amax / _pre_quant_scale keys
  (megatron.py:520-531, :874-886): nothing to collide, lose or reshard: pass everywhere;
- 0.48.0rc1 keeps the GroupedQuantizer members' amax through the reset (custom.py:180-186), so
  _QuantTEGroupedLinear.modelopt_post_restore dry-runs every expert's integer weight quantizer on
  the amax torch.empty made before the checkpoint's values load (transformer_engine.py:173-233,
  tensor_quantizer.py:1364), whose kernel asserts amax >= 0 (tensor_quant_gpu.cu:44): the save's
  reference reload (pp 1, amax kept on reload) is the first stage that restores, so every cell of
  the integer witnesses expects restore-dry-run; the patched twins install part (g) (scenario
  fix_parts "unloaded-amax"), which removes it, and keep the rules above.
"""
from __future__ import annotations

import pytest

from harness.check import decision as decision_module
from harness.check.versions import rules_for
from harness.model.recipes import EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL, SHARED_EXPERTS
from harness.records import Expected
from harness.scenario.scenarios import load_all

pytestmark = pytest.mark.cpu

SAVE = "save=tp1-etp1-ep2-pp1"
SAVE_ONLY, OTHER_EP, TP_CHANGE, ETP_CHANGE = ("save-only", "load=tp1-etp1-ep1-pp1",
                                              "load=tp2-etp1-ep2-pp1", "load=tp1-etp2-ep1-pp1")
P, LOST, FAIL, UNKNOWN = Expected.PASS, Expected.AMAX_LOST, Expected.FAIL_LOAD, Expected.RULE_UNKNOWN
REFUSED = Expected.RESHARD_REFUSED
DRY = Expected.RESTORE_DRY_RUN

# scenario -> {modelopt: {cell: expected}} under megatron-core 0.19.2 (and 0.16.1: same rules)
EXPECTED = {
    "gpu-per-channel-recipe-witness": {
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: LOST, TP_CHANGE: FAIL, ETP_CHANGE: FAIL},
        "0.48.0rc1": {SAVE_ONLY: DRY, OTHER_EP: DRY, TP_CHANGE: DRY, ETP_CHANGE: DRY},
    },
    "gpu-per-channel-recipe": {  # part (g): no dry-run defect
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: REFUSED},
        "0.48.0rc1": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: REFUSED},
    },
    "gpu-per-block-recipe-witness": {
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: LOST, TP_CHANGE: FAIL, ETP_CHANGE: FAIL},
        "0.48.0rc1": {SAVE_ONLY: DRY, OTHER_EP: DRY, TP_CHANGE: DRY, ETP_CHANGE: DRY},
    },
    "gpu-per-block-recipe": {
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: REFUSED, ETP_CHANGE: P},
        "0.48.0rc1": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: REFUSED, ETP_CHANGE: P},
    },
    "gpu-no-amax-recipe-witness": {
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: P},
        "0.48.0rc1": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: P},
    },
    "gpu-no-amax-recipe": {
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: P},
    },
    # static NVFP4 on every family: the existing static-block rules (versions.py static_block_rule,
    # dense_static_block_rule, fixed_static_block_rule); complete static state is not re-calibrated
    # (custom.py:177-181 _has_complete_static_nvfp4_weight_state): no second bug
    "gpu-four-over-six-recipe-witness": {
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: FAIL, ETP_CHANGE: FAIL},
        "0.48.0rc1": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: REFUSED},
    },
    "gpu-four-over-six-recipe": {  # part (f): fixed_static_block_rule, a pass at another ETP
        "0.47.0": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: P},
        "0.48.0rc1": {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: P, ETP_CHANGE: P},
    },
}
CASES = [(s, v, mc) for s, per in EXPECTED.items() for v in per for mc in ("0.19.2", "0.16.1")]


def _scenario(name):
    return next(s for s in load_all() if s.name == name)


@pytest.mark.parametrize("name,modelopt,mcore", CASES)
def test_each_cell_of_the_new_scenarios_expects_what_the_sources_say(name, modelopt, mcore):
    scenario = _scenario(name)
    cells = {c.id.split(",", 1)[1].rstrip("]"): c for c in scenario.cells()}
    assert all(c.id.split(",", 1)[0].endswith(SAVE) for c in scenario.cells())
    assert set(cells) == set(EXPECTED[name][modelopt]), sorted(cells)
    got = {k: decision_module.decide(c.plan, modelopt, mcore) for k, c in cells.items()}
    assert {k: d.expected for k, d in got.items()} == EXPECTED[name][modelopt], \
        {k: d.notice for k, d in got.items()}
    assert not any(d.skip for d in got.values()), {k: d.skip for k, d in got.items()}
    # the model has a shared expert: every family's kind is judged
    assert all(set(d.kinds) == {EXPERTS, SHARED_EXPERTS, OTHER} for d in got.values())


AWQ_KINDS = {f: ["per-block", "scalar"] for f in (EXPERTS, SHARED_EXPERTS, OTHER)}
# per-block+scalar (W4A8_AWQ_BETA_CFG), judged by the kinds a save records (no forecast): the
# per-block rule decides where the scalar one passes
AWQ = {
    ("gpu-awq-recipe-witness", "0.47.0"): {SAVE_ONLY: P, OTHER_EP: LOST, TP_CHANGE: FAIL, ETP_CHANGE: FAIL},
    # per-block experts: the restore dry run (0.48.0rc1 keeps the members' amax) at the save's reload
    ("gpu-awq-recipe-witness", "0.48.0rc1"): {SAVE_ONLY: DRY, OTHER_EP: DRY, TP_CHANGE: DRY, ETP_CHANGE: DRY},
    ("gpu-awq-recipe", "0.47.0"): {SAVE_ONLY: P, OTHER_EP: P, TP_CHANGE: REFUSED, ETP_CHANGE: P},
}


@pytest.mark.parametrize("name,modelopt", list(AWQ))
def test_the_awq_scenarios_are_judged_by_the_kinds_their_save_records(name, modelopt):
    cells = {c.id.split(",", 1)[1].rstrip("]"): c for c in _scenario(name).cells()}
    from harness.check.matching import matched

    before = {k: decision_module.decide(c.plan, modelopt, "0.19.2").expected for k, c in cells.items()}
    after = {k: decision_module.decide(c.plan, modelopt, "0.19.2", AWQ_KINDS).expected
             for k, c in cells.items()}
    assert after == AWQ[name, modelopt]
    plan = next(iter(cells.values())).plan
    if matched(plan.recipe, modelopt, plan.families).kinds is None:
        assert set(before.values()) == {UNKNOWN}  # no forecast of that release: nothing known
    else:  # ModelOpt's own matching of that release forecasts the kinds a save records
        assert before == after


@pytest.mark.parametrize("exc_type, message, outcome", [
    ("harness.model.quant.NotQuantizable",  # as the ranks wrap ModelOpt's exception
     "AttributeError: 'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'",
     "not-quantizable"),
    # a record written before the ranks wrapped it: ModelOpt's refusal by its own words
    ("AttributeError", "'QuantTEColumnParallelGroupedLinear' object has no attribute 'weight'",
     "not-quantizable"),
    ("AttributeError", "'NoneType' object has no attribute 'weight'", "unexpected-failure"),
])
def test_an_awq_save_modelopt_refuses_is_not_quantizable(exc_type, message, outcome):
    """ModelOpt's own refusal of AWQ on TE grouped experts (harness/model/quant.py NotQuantizable)
    is judged not-quantizable for the save and each load of it, never rule-unknown; any other
    exception of the save is no refusal of ModelOpt's."""
    from harness.check import judge
    from harness.records import CauseKind, CellRecord, StageCause, StageResult

    cell = next(c for c in _scenario("gpu-awq-recipe-witness").cells() if c.load is None)
    rec = CellRecord(scenario=cell.scenario.name, cell_id=cell.id, tier="gpu-shared", backend="te",
                     save_topology=cell.save.id, load_topology=None, patch="none", expected="",
                     modelopt="0.47.0", mcore="0.19.2", recipe=cell.scenario.recipe)
    cause = StageCause(rank=0, kind=CauseKind.EXCEPTION, exc_type=exc_type, message=message, key=None)
    save = StageResult(stage="save", ok=False, wall_s=1.0, cause=cause,
                       environment={"nvidia-modelopt": "0.47.0", "megatron-core": "0.19.2"})
    assert judge.judge_cell(rec, cell.plan, save, None).outcome == outcome


@pytest.mark.parametrize("name", ["gpu-no-amax-recipe", "gpu-awq-recipe"])
def test_the_patched_twins_are_skipped_on_0_48_0rc1_which_has_parts_a_to_e_itself(name):
    """The fix (parts a-e) exists for 0.47.0 only: the queue runs these twins in its 0.47.0-fix
    part (gpu-four-over-six-recipe asks for part (f) alone, which 0.48.0rc1 has)."""
    for cell in _scenario(name).cells():
        assert decision_module.decide(cell.plan, "0.48.0rc1", "0.19.2").skip


@pytest.mark.parametrize("name", ["gpu-per-channel-recipe", "gpu-per-block-recipe"])
def test_the_integer_twins_run_on_0_48_0rc1_with_part_g_alone(name):
    """The integer twins ask for part (g) alone (fix_parts "unloaded-amax"), which the fix has for
    0.48.0rc1 (harness.fix PARTS_ONLY_VERSIONS): they run there, the dry-run defect removed."""
    for cell in _scenario(name).cells():
        d = decision_module.decide(cell.plan, "0.48.0rc1", "0.19.2")
        assert not d.skip and d.expected != DRY


@pytest.mark.parametrize("name,want", [("gpu-per-channel-recipe", REFUSED), ("gpu-per-block-recipe", P)])
def test_an_etp_change_of_an_integer_expert_amax_follows_the_gpu_decided_rule(name, want):
    cell = next(c for c in _scenario(name).cells() if c.id.endswith(ETP_CHANGE + "]"))
    d = decision_module.decide(cell.plan, "0.47.0", "0.19.2")
    assert d.expected == want, d.notice


def test_a_dense_per_block_amax_at_another_tp_is_refused():
    cell = next(c for c in _scenario("gpu-per-block-recipe").cells() if c.id.endswith(TP_CHANGE + "]"))
    assert decision_module.decide(cell.plan, "0.48.0rc1", "0.19.2").expected == REFUSED


@pytest.mark.parametrize("modelopt,drops", [("0.47.0", True), ("0.48.0rc1", False)])
def test_the_rule_fields_of_each_new_kind(modelopt, drops):
    b = rules_for(modelopt, "0.19.2")
    for kind, reshard in ((PER_CHANNEL, REFUSED), (PER_BLOCK, P)):
        r = b.kind_rule(kind, EXPERTS)
        # built like the scalar amax (0.47.0: no groups; 0.48.0rc1: the expert groups)
        assert (r.replica_rule_applies, r.lost_on_reload, r.reshard) == (True, drops, reshard)
        assert r.save_refused_split is None and r.source and "234019" in r.checked_on
    no = b.kind_rule(NO_AMAX, EXPERTS)
    assert (no.replica_rule_applies, no.lost_on_reload, no.reshard) == (False, False, P)
    for family in (SHARED_EXPERTS, OTHER):
        assert b.kind_rule(PER_CHANNEL, family).reshard == P
        assert b.kind_rule(PER_BLOCK, family).reshard == REFUSED
        assert "234019" in b.kind_rule(PER_BLOCK, family).checked_on
        assert b.kind_rule(NO_AMAX, family).reshard == P
        assert not any(b.kind_rule(k, family).replica_rule_applies for k in (PER_CHANNEL, PER_BLOCK, NO_AMAX))
    for rule in (b.kind_rule(k, f) for k in (PER_CHANNEL, PER_BLOCK, NO_AMAX)
                 for f in (EXPERTS, SHARED_EXPERTS, OTHER)):
        assert "megatron.py:" in rule.source


@pytest.mark.parametrize("modelopt", ["0.47.0", "0.48.0rc1"])
def test_megatron_core_0_15_has_no_rule_for_the_new_kinds(modelopt):
    """Its decorator era was read for the scalar amax only: the new kinds stay rule-unknown."""
    b = rules_for(modelopt, "0.15.3")
    assert all(b.kind_rule(k, EXPERTS) is None for k in (PER_CHANNEL, PER_BLOCK, NO_AMAX))


def test_the_fix_changes_no_rule_of_the_new_kinds_by_part_f():
    """Part (f) (static NVFP4 blocks) has fixed_kinds for static-block only."""
    from harness.fix import STATIC_BLOCK_PART

    b = rules_for("0.47.0", "0.19.2")
    for kind in (PER_CHANNEL, PER_BLOCK, NO_AMAX):
        assert b.kind_rule(kind, EXPERTS, (STATIC_BLOCK_PART,)) is b.kinds[kind]


def test_the_recorded_kinds_of_a_new_recipe_decide_after_its_save():
    """A save that recorded scalar experts for the INT8 recipe is judged as scalar (and the
    disagreement with the forecast is named)."""
    cell = next(c for c in _scenario("gpu-per-channel-recipe-witness").cells()
                if c.id.endswith(ETP_CHANGE + "]"))
    d = decision_module.decide(cell.plan, "0.48.0rc1", "0.19.2", {"experts": ["scalar"]})
    assert d.expected == P and "'experts': ['scalar']" in d.forecast_disagreement


def test_the_extra_extensions_are_named_and_an_unknown_one_is_refused():
    from harness.launch import extensions

    var = extensions.PRECOMPILE_VAR
    assert extensions.extra_names({}) == []
    assert extensions.extra_names({var: "base, mx"}) == ["base", "mx"]
    with pytest.raises(SystemExit, match="unknown extension"):
        extensions.extra_names({var: "fp4"})
