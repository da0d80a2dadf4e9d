"""What a planned cell is expected to do under the rule of one (ModelOpt, megatron-core) pair:
the one place the expectation rule lives (harness/check/plan.py holds the facts it reads)."""
from __future__ import annotations

from harness.check.layouts import Restore
from harness.check.plan import CellPlan
from harness.check.recipes import recipe_facts
from harness.records import ExpectMode, Expected, Patch
from harness.tiers import Backend
from harness.topology import oracle


def expected(plan: CellPlan, behaviour) -> str:
    """pass | fail-save | fail-load | amax-lost | not-restored | rule-unknown.

    ``oracle`` mode: a pair, recipe or amax kind with no rule predicts nothing; an unpatched
    golden whose layout that version cannot restore expects ``not-restored``; then the version's
    replica rule (the fix's rule when patched, harness/topology/oracle.py) for the save, then the
    load topology; then the amax kind's rule at an expert-TP change; then, unpatched on
    TEGroupedMLP, the second bug where that version has it for that kind: every local expert's
    weight-quantizer amax but expert 0's is gone after ``load_state_dict`` whenever a load rank
    holds more than one expert.
    """
    if plan.recorded_expected is not None:
        return plan.recorded_expected
    if plan.expect == ExpectMode.PASS:
        return Expected.PASS
    if not behaviour.known:
        return Expected.RULE_UNKNOWN  # no rule for the pair: predict nothing
    facts = recipe_facts(plan.recipe)
    kind = behaviour.kind_rule(facts.expert_kind) if facts else None
    if kind is None:
        return Expected.RULE_UNKNOWN  # a recipe, or an amax kind, with no rule for the pair
    patched = plan.patch == Patch.FIX
    if behaviour.cannot_save and plan.backend == Backend.TE:  # every sharded_state_dict call raises
        return Expected.FAIL_LOAD if plan.golden else Expected.FAIL_SAVE
    if plan.golden and not patched and behaviour.golden_restore.get(plan.golden_layout) != Restore.RESTORED:
        return Expected.NOT_RESTORED
    rule = "expert-tp" if patched else behaviour.replica_rule
    rule = rule if kind.replica_rule_applies else None
    shared = behaviour.shared_rule if plan.backend == Backend.TE else None

    def fails(topo) -> bool:
        return bool((rule and oracle.predicts_failure(topo, rule))
                    or (shared and oracle.shared_collisions(topo, shared)))

    save, load = plan.save, plan.load
    if fails(save):
        return Expected.FAIL_SAVE
    if load and fails(load):
        return Expected.FAIL_LOAD
    if load and load.etp != save.etp and kind.etp_change != Expected.PASS:
        return kind.etp_change or Expected.RULE_UNKNOWN
    if (load and not patched and plan.backend == Backend.TE and kind.lost_on_reload
            and plan.num_experts // load.ep > 1):
        return Expected.AMAX_LOST
    return Expected.PASS
