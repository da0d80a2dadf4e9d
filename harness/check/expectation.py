"""What a planned cell is expected to do under the rule of one (ModelOpt, megatron-core) pair:
the one place the expectation rule lives (harness/check/plan.py holds the facts it reads)."""
from __future__ import annotations

from harness.check.layouts import Restore
from harness.check.plan import CellPlan
from harness.check.recipes import recipe_forecast
from harness.check.defects import RestoreDefect, defect_covers, model_defect
from harness.check.kinds import FAMILY_SPLIT, reference_reload, split_of
from harness.check.matching import matched
from harness.check.versions import installed_mcore, installed_modelopt
from harness.model.recipes import EXPERTS
from harness.records import ExpectMode, Expected, Patch, Stage
from harness.tiers import Backend, on_cuda
from harness.topology import oracle

Kinds = dict[str, list[str]]  # module family -> the amax kinds of its weight quantizers


def kinds_for(plan: CellPlan, recorded: Kinds | None, modelopt: str | None = None) -> Kinds | None:
    """The kinds that decide: what the save recorded once it ran, else the recipe's forecast on
    the cell's model: the catalogue's (harness/check/recipes.py), else that of ModelOpt's own
    matching for the release ``modelopt`` (None: the installed one; harness/check/matching.py).
    None: none of them gives the routed experts a kind."""
    return recorded or forecast_kinds(plan, modelopt)


def forecast_kinds(plan: CellPlan, modelopt: str | None = None) -> Kinds | None:
    """The recipe's forecast on the cell's model before any save: the catalogue's, else ModelOpt
    ``modelopt``'s own matching (None: the installed release)."""
    return recipe_forecast(plan.recipe, modelopt or installed_modelopt(), plan.families)


def no_kinds_why(plan: CellPlan, modelopt: str | None = None) -> str:
    """Why no amax kind of the routed experts is known for ``plan``'s recipe, in one line: no save
    recorded them, the catalogue has no forecast, and what ModelOpt's own matching says."""
    told = matched(plan.recipe, modelopt or installed_modelopt(), plan.families).why
    return (f"recipe {plan.recipe}: no amax kinds of the routed experts known: no save recorded "
            f"them, harness/check/recipes.py has no forecast, and {told}: nothing to judge them by")


def expected(plan: CellPlan, behaviour) -> str:
    """The expectation before a save has run: the forecast's kinds and the fix's parts the
    scenario asks for decide."""
    return expectation(plan, behaviour, kinds_for(plan, None), plan.fix_parts)[0]


def restore_defect(plan: CellPlan, rules: dict, patched: bool) -> RestoreDefect | None:
    """The defect of ModelOpt's restore (harness/check/versions.py RESTORE_DRY_RUN) a routed-expert
    kind's rule carries, where a stage of the cell restores ModelOpt's state on TE grouped experts:
    a load (a golden's included), or the save's reference reload (versions.reference_reload, as
    harness/rank/stages.py save_stage decides it); else None."""
    if plan.backend != Backend.TE:
        return None  # the defect is the TE grouped linear's post-restore
    experts = [r for (family, _), r in rules.items() if family == EXPERTS]
    defect = next((r.restore_defect for r in experts if r.restore_defect), None)
    if defect is None:
        return None
    restores = plan.load is not None or (not plan.golden and reference_reload(
        patched, False, experts, plan.save.pp, on_cuda(plan.tier)))
    return defect if restores else None


def expectation(plan: CellPlan, behaviour, kinds: Kinds | None,
                fix_parts: tuple[str, ...] = (), mcore: str | None = None,
                restore_defects: bool = True, modelopt: str | None = None) -> tuple[str, str | None]:
    """(pass | fail-save | fail-load | amax-lost | not-restored | reshard-refused |
    mtp-embedding-refused | restore-dry-run | rule-unknown, and for rule-unknown from a kind or a
    model defect: one line naming what has no rule). ``mcore``: the megatron-core that ran (None:
    the installed one); ``modelopt``: the ModelOpt that ran (None: the installed one), whose own
    matching forecasts a recipe's kinds where nothing else does. ``restore_defects`` False: the expectation behind a restore defect (what
    the cell is judged by where that nondeterministic defect did not fire:
    harness/check/decision.py works it out once, beside the defect's).

    ``oracle`` mode: a pair with no rule, unknown kinds, or a (kind, family) the pair has no rule
    for predicts nothing; megatron-core's own refusal of a model tensor (MODEL_DEFECTS: MTP at
    pp > 1 with a learned absolute position embedding) decides the first stage that meets it,
    before the collision (a release whose sources were not read for it: rule-unknown); an unpatched golden whose layout that version cannot restore expects
    ``not-restored``; then the version's replica rule (the fix's rule when patched,
    harness/topology/oracle.py) on the routed experts' kinds for the save, then the load
    topology; then each family's kind at a change of the size that family is split over (expert
    TP for routed experts, TP for the rest; under the fix, its rule with the ``fix_parts`` the ranks
    installed, harness/check/versions.py kind_rule); then, unpatched on TEGroupedMLP, the second bug where
    an expert kind has it: every local expert's weight-quantizer amax but expert 0's is gone after
    ``load_state_dict`` whenever a load rank holds more than one expert.

    A defect of ModelOpt's restore a routed-expert kind's rule carries (``KindRule.restore_defect``:
    the grouped post-restore's dry run on integer amax not yet loaded) decides the first stage
    that restores ModelOpt's state, in the order the stages meet things: a save's model defect and
    collision come first (its reference reload follows the save), then the save's reload, else the
    load's restore (before anything the load's validation or verify meets); a golden cell's load
    restores first of all. Nondeterministic: ``restore-dry-run`` means "passes (then judged by the
    expectation behind it), or dies of it".
    """
    if plan.recorded_expected is not None:
        return plan.recorded_expected, None
    if plan.expect == ExpectMode.PASS:
        return Expected.PASS, None
    if not behaviour.known:
        return Expected.RULE_UNKNOWN, None  # no rule for the pair: its notice says so
    if not kinds or EXPERTS not in kinds:
        return Expected.RULE_UNKNOWN, no_kinds_why(plan, modelopt)
    rules = {}
    parts = fix_parts if plan.patch == Patch.FIX else ()  # the parts of harness.fix installed
    for family, names in sorted(kinds.items()):
        for kind in names:
            rule = behaviour.kind_rule(kind, family, parts)
            if rule is None:
                return Expected.RULE_UNKNOWN, (
                    f"recipe {plan.recipe}: no rule for amax kind {kind!r} of the {family} under "
                    f"{behaviour.label} (harness/check/versions.py)")
            rules[family, kind] = rule
    experts = [r for (family, _), r in rules.items() if family == EXPERTS]
    patched = plan.patch == Patch.FIX
    dry_run = restore_defect(plan, rules, patched) if restore_defects else None

    if behaviour.cannot_save and plan.backend == Backend.TE:  # every sharded_state_dict call raises
        return (Expected.FAIL_LOAD if plan.golden else Expected.FAIL_SAVE), None
    if plan.golden and dry_run:  # the golden's load restores ModelOpt's state first
        return Expected.RESTORE_DRY_RUN, None
    if plan.golden and not patched and behaviour.golden_restore.get(plan.golden_layout) != Restore.RESTORED:
        return Expected.NOT_RESTORED, None
    rule = "expert-tp" if patched else behaviour.replica_rule
    rule = rule if any(r.replica_rule_applies for r in experts) else None
    shared = behaviour.shared_rule if plan.backend == Backend.TE else None

    def fails(topo) -> bool:
        return bool((rule and oracle.predicts_failure(topo, rule))
                    or (shared and oracle.shared_collisions(topo, shared)))

    save, load = plan.save, plan.load
    # megatron-core's own refusal of a model tensor at a stage names that key first (rank 0's
    # keys lead its validation's errors, the embedding first): it decides that stage.
    defect = model_defect(plan.mtp_num_layers, plan.position_embedding, save, load)
    if defect and not defect_covers(defect[0], mcore or installed_mcore()):
        return Expected.RULE_UNKNOWN, (
            f"{defect[0].label} (megatron-core {mcore or installed_mcore()}): only megatron-core "
            f"{defect[0].mcore} was read for it (harness/check/versions.py MODEL_DEFECTS)")
    if defect and defect[1] == Stage.SAVE:
        return Expected.MTP_EMBEDDING_REFUSED, None
    if fails(save):
        return Expected.FAIL_SAVE, None
    if dry_run:  # the save's reference reload, else the load's restore, before its validation
        return Expected.RESTORE_DRY_RUN, None
    if defect:  # at the load
        return Expected.MTP_EMBEDDING_REFUSED, None
    if load and fails(load):
        return Expected.FAIL_LOAD, None
    if load:
        resharded = {key: r.reshard for key, r in rules.items()
                     if split_of(key[0], load) != split_of(key[0], save) and r.reshard != Expected.PASS}
        for (family, kind), word in resharded.items():
            if word is None:
                split = FAMILY_SPLIT.get(family, "tp")
                return Expected.RULE_UNKNOWN, (
                    f"recipe {plan.recipe}: amax kind {kind!r} of the {family} loaded at another "
                    f"{split} ({split}{split_of(family, save)} -> {split}{split_of(family, load)}): "
                    f"no rule under {behaviour.label} (harness/check/versions.py KindRule.reshard)")
        if resharded:
            return next(iter(resharded.values())), None
    if (load and not patched and plan.backend == Backend.TE and any(r.lost_on_reload for r in experts)
            and plan.num_experts // load.ep > 1):
        return Expected.AMAX_LOST, None
    return Expected.PASS, None
