"""A cell's decision under one (ModelOpt, megatron-core) pair and one set of amax kinds: its
expectation, notice and skip reason, worked out once into a frozen ``CellDecision``.

Why: the expectation used to be worked out wherever it was needed (the new record, the skip
check, each stage, the verdict's note), up to four times per cell, and each route could read
other facts. Now the controller decides once before the stages run (the forecast's kinds) and
the judge (harness/check/judge.py ``judge_cell``) reuses that decision unless the ranks imported
another pair or the save recorded other kinds: then those decide, once.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.check import versions
from harness.check.defects import RESTORE_DRY_RUN, common_pt_problem
from harness.check.expectation import Kinds, expectation, forecast_kinds, kinds_for
from harness.check.plan import CellPlan
from harness.check.recipes import disagreement
from harness.check.versions import Behaviour, installed_mcore, plugin_problem
from harness.records import Expected, Patch
from harness.tiers import on_cuda


@dataclass(frozen=True)
class CellDecision:
    """What a cell is expected to do, and why, under one pair and one set of amax kinds."""

    modelopt: str | None
    mcore: str | None
    behaviour: Behaviour
    expected: str
    notice: str | None  # why nothing is predicted (rule-unknown), in one line; else None
    skip: str | None  # why the pair cannot run the cell meaningfully, or None
    kinds: Kinds | None  # the kinds that decided: what the save recorded, else the forecast
    forecast_disagreement: str | None = None
    # the fix's parts that decided: what the ranks installed, else what the scenario asks for
    fix_parts: tuple[str, ...] = ()
    # where ``expected`` is restore-dry-run (a nondeterministic defect): the expectation behind
    # it, which judges the cell where the defect does not fire, and its one line (rule-unknown)
    behind: str | None = None
    behind_notice: str | None = None

    @property
    def expectations(self) -> str:
        return self.behaviour.label

    def holds_for(self, modelopt: str | None, mcore: str | None, recorded: Kinds | None,
                  fix_parts: tuple[str, ...] | None = None) -> bool:
        """Whether this decision is the one for that pair, those recorded kinds and those fix
        parts (None: the plan's, as ``decide``)."""
        return ((modelopt, mcore) == (self.modelopt, self.mcore)
                and (not recorded or recorded == self.kinds)
                and (fix_parts is None or tuple(fix_parts) == self.fix_parts))


def decide(plan: CellPlan, modelopt: str | None, mcore: str | None,
           recorded: Kinds | None = None, fix_parts: tuple[str, ...] | None = None) -> CellDecision:
    """The one computation of a cell's expectation, notice and skip reason under the pair
    (``mcore`` None: the installed megatron-core), the kinds and the fix parts that decide
    (``fix_parts`` None: those the scenario asks for, before a stage has said what it installed)."""
    mcore = mcore or installed_mcore()
    behaviour = versions.rules_for(modelopt, mcore)
    kinds = kinds_for(plan, recorded, modelopt)
    parts = plan.fix_parts if fix_parts is None else tuple(fix_parts)
    word, why = expectation(plan, behaviour, kinds, parts, mcore, modelopt=modelopt)
    behind = behind_why = None
    if word == Expected.RESTORE_DRY_RUN:
        behind, behind_why = expectation(plan, behaviour, kinds, parts, mcore, restore_defects=False,
                                         modelopt=modelopt)
        why = (f"{RESTORE_DRY_RUN.label} (harness/check/versions.py RESTORE_DRY_RUN): "
               "nondeterministic, a stage that restores may die of it (known-refusal) or pass; "
               f"where it passes the cell is judged as `{behind}`"
               + (f": {behind_why}" if behind_why else ""))
    return CellDecision(
        modelopt=modelopt, mcore=mcore, behaviour=behaviour, expected=word, fix_parts=parts,
        behind=behind, behind_notice=behind_why,
        notice=behaviour.notice(modelopt, mcore) or why, kinds=kinds,
        skip=version_skip_reason(plan, behaviour, modelopt, mcore),
        forecast_disagreement=disagreement(plan.recipe, forecast_kinds(plan, modelopt), recorded),
    )


def decision_fields(d: CellDecision) -> dict:
    """The decision's record fields: pair, rules, expectation, notice, forecast disagreement."""
    return {"modelopt": d.modelopt, "mcore": d.mcore, "expectations": d.expectations,
            "expected": d.expected, "notice": d.notice, "forecast_disagreement": d.forecast_disagreement}


def version_skip_reason(cell: CellPlan, behaviour, modelopt: str | None,
                        mcore: str | None = None) -> str | None:
    """Why the pair (default megatron-core: the installed one) cannot run this cell meaningfully,
    or None."""
    mcore = mcore or installed_mcore()
    if cell.patch == Patch.FIX and not behaviour.fix_runs(cell.fix_parts):
        from harness.fix import SUPPORTED_MCORE_VERSIONS, SUPPORTED_MODELOPT_VERSION

        return (f"harness.fix is written for nvidia-modelopt {SUPPORTED_MODELOPT_VERSION} only, "
                f"with megatron-core {'/'.join(SUPPORTED_MCORE_VERSIONS)}; {modelopt} is "
                f"installed with megatron-core {mcore} (a fixed release needs no "
                "patch: see the unpatched scenarios)")
    if not on_cuda(cell.tier) and (behaviour.plugin_needs_te or not behaviour.known):
        return plugin_problem()
    if cell.golden:  # a golden in a torch_dist format this megatron-core cannot read
        from harness.paths import shown_path

        ckpt = cell.golden_ckpt
        problem = common_pt_problem(ckpt, mcore, shown=shown_path(ckpt))
        if problem:
            return f"golden not loadable here: {problem}"
    return None
