"""A cell's outcome from its stage results, under the rules of the ModelOpt that ran.

Pure judging, in one place: ranks measure (harness/rank/), the controller runs stages
(harness/run/cell.py) and hands the typed results to ``judge_cell``, once per cell. Recorded
runs are judged again by the same function (harness/check/rejudge.py ``rejudge_record``, used by
``harness verdict`` and ``harness equivalence --rejudge``); the matrix and the reports read the
outcome a record holds and judge nothing themselves.

Each step returns the fields it decides (``Fields``) and writes into no record; ``judge_cell``
combines them, in the order of precedence written there, into the one record it returns
(tests/test_judge_pure.py keeps it so).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from harness.check.decision import CellDecision, decide, decision_fields
from harness.check.defects import MODEL_DEFECTS, MTP_POSITION_EMBEDDING, RESTORE_DRY_RUN
from harness.check.keys import is_expert_weight_amax
from harness.check.logits import topology_finding
from harness.check.plan import CellPlan
from harness.check.refusals import (expert_tensors, is_amax_refusal, is_bug, is_not_quantizable,
                                    is_shape_refusal, shape_refusal_finding)
from harness.check.verify_figures import held_after_load, judged_verify, verify_problems
from harness.check.versions import installed_mcore
from harness.records import FIX_PARTS_ENV_KEY, CellRecord, Expected, Outcome, Stage, StageCause, StageResult

# CellRecord field -> the value one step of judging decides for it.
Fields = dict


@dataclass(frozen=True)
class Facts:
    """What the steps read of the record under the decision that judges it: read, never written."""

    expected: str
    evidence: dict | None
    modelopt: str | None
    tier: str
    recipe_ref: str
    amax_kinds: dict | None


def judge_cell(rec: CellRecord, cell: CellPlan, save: StageResult | None, load: StageResult | None,
               stopped: str | None = None, decision: CellDecision | None = None) -> CellRecord:
    """The cell's record judged from what ran: ``save`` (None: not run), ``load`` (None: not run
    or a save-only cell) and ``stopped`` (the signal that stopped the controller before the save).

    Returns a new record (``rec`` is not touched) with the decision of the pair the ranks imported
    and the kinds the save recorded (``decision``, the controller's from before the stages ran, is
    reused when those are its own), the outcome, failure, judged verify figures and the
    cross-topology finding."""
    d, fields = ran_decision(rec, cell, save, load, decision)
    base = copy.deepcopy(rec)  # the fields judging leaves as they were, shared with nothing of rec's
    fields["evidence"] = ran_evidence(base.evidence, save, load)
    f = Facts(fields["expected"], fields["evidence"], fields["modelopt"], base.tier, base.recipe_ref,
              fields.get("amax_kinds", base.amax_kinds))
    judged = not_judged_by_expectation(f, cell, save, load, stopped, d)
    if judged is None:  # a save, or a load, that ran to its end: judged against the expectation
        loaded = cell.load is not None and save.ok
        blocked_by = cell.save.id if cell.load is not None and not save.ok else None
        judged = known_restore_refusal(f.expected, load if loaded else save, blocked_by)
        if judged is None and blocked_by:
            judged = known_model_refusal(f.expected, save, cell.save, cell, blocked_by)
        if judged is None:
            # an expected restore defect that did not fire: the expectation behind it judges instead
            behind = judged_behind_restore_defect(f.expected, d)
            f = replace(f, expected=behind.get("expected", f.expected))
            judged = {**behind, **(blocked(f.expected, save, blocked_by) if blocked_by else
                                   judged_load(f, load, cell, d) if loaded else save_only(f, save, cell, d))}
        if loaded:  # the finding of the figures the record holds: the load's, else those it came with
            judged["finding"] = topology_finding(judged.get("verify", base.verify))
    fields.update(judged)  # over the decision's fields: the expectation behind included, and its notice
    # rule-unknown last: a pair with no rule predicts nothing, so it overrides what the stages came to
    fields.update(settle_unknown(fields["expected"], fields["outcome"], fields.get("reason", base.reason),
                                 fields.get("message", base.message), fields["notice"]))
    return replace(base, **fields)


def not_judged_by_expectation(f: Facts, cell: CellPlan, save: StageResult | None,
                              load: StageResult | None, stopped: str | None, d: CellDecision) -> Fields | None:
    """What no expectation decides: a cell not run (skipped, or stopped before its save), a stage
    interrupted, a recipe ModelOpt refuses, a load not run. None: a stage ran to its end."""
    if save is None or (d.skip and not stopped):
        if stopped:
            return interrupted(None, stopped)
        return dict(outcome=Outcome.SKIPPED, reason=d.skip or "not run")
    if save.interrupted:
        return interrupted(save, save.interrupted)
    if is_not_quantizable(save.cause):
        return not_quantizable(f, save)
    if cell.load is None or not save.ok:
        return None
    if load is None:
        return dict(outcome=Outcome.SKIPPED, reason="load stage not run")
    if load.interrupted:
        return interrupted(load, load.interrupted)
    return None


def ran_decision(rec: CellRecord, cell: CellPlan, save: StageResult | None, load: StageResult | None,
                 decision: CellDecision | None = None) -> tuple[CellDecision, dict]:
    """The decision under the pair the stages' ranks imported (the record's until a stage has
    reported) and the kinds the save recorded (``decision`` reused when it is that one), and the
    record fields they give (amax kinds and keys, fix parts, the decision's); ``rec`` untouched."""
    env = {}
    for stage in (save, load):
        if stage is not None:
            env.update({k: v for k, v in stage.environment.items() if v})
    modelopt = env.get("nvidia-modelopt") or rec.modelopt
    mcore = env.get("megatron-core") or rec.mcore or installed_mcore()
    seen: dict = {}
    if save is not None and save.stage == Stage.SAVE:
        kinds = save.amax_kinds if save.amax_kinds is not None else save.rank0.get("amax_kinds")
        if kinds is not None:  # recorded once calibration ended: a failed save has them too
            seen["amax_kinds"] = kinds
    if save is not None and save.amax_keys is not None:
        seen["amax_keys"] = save.amax_keys
    if env.get(FIX_PARTS_ENV_KEY):
        seen["fix_parts"] = list(env[FIX_PARTS_ENV_KEY])
    recorded = seen.get("amax_kinds", rec.amax_kinds)
    parts = fix_parts_that_decide(seen.get("fix_parts", rec.fix_parts), cell,
                                  ran=save is not None or load is not None)
    if decision is None or not decision.holds_for(modelopt, mcore, recorded, parts):
        decision = decide(cell, modelopt, mcore, recorded, parts)
    return decision, {**seen, **decision_fields(decision)}


def fix_parts_that_decide(recorded: list[str] | None, cell: CellPlan, ran: bool) -> tuple[str, ...]:
    """The fix's parts a cell is judged under: those its ranks recorded installing (``recorded``);
    none when a stage ran and no rank said (an unpatched stage, one that failed before it could
    say, or a record made before ``fix_parts``: judged as it was then); before any stage ran, what
    the scenario asks for (the forecast)."""
    if recorded is not None:
        return tuple(recorded)
    return () if ran else cell.fix_parts


def model_defect_seen(cause: StageCause | None, topology, cell: CellPlan):
    """The model defect (harness/check/versions.py MODEL_DEFECTS) a stage at ``topology`` met,
    by megatron-core's own words on its key, where the cell's model reaches it; else None."""
    for defect in MODEL_DEFECTS:
        if not defect.reached(cell.mtp_num_layers, cell.position_embedding, topology):
            continue
        if (cause and (cause.exc_type or "").endswith(defect.exception)
                and defect.text in (cause.message or "")
                and (cause.key == defect.key or f"key='{defect.key}'" in (cause.message or ""))):
            return defect
    return None


def known_model_refusal(expected: str, stage: StageResult, topology, cell: CellPlan,
                        blocked_by: str | None = None) -> Fields | None:
    """A failed stage that is the model defect the cell expects: ``known-refusal`` with the
    defect's finding (and, for a load cell, that its save was the stage refused); else None."""
    if expected != Expected.MTP_EMBEDDING_REFUSED or stage.timed_out:
        return None
    defect = model_defect_seen(stage.cause, topology, cell)
    if defect is None:
        return None
    return dict(failure(stage), outcome=Outcome.KNOWN_REFUSAL, reason=(
        f"blocked by the save at {blocked_by}, which megatron-core refused: " if blocked_by else ""
    ) + defect.finding)


def known_restore_refusal(expected: str, stage: StageResult, blocked_by: str | None = None) -> Fields | None:
    """A failed stage that is the restore defect the cell expects (``restore-dry-run``:
    harness/check/versions.py RESTORE_DRY_RUN, by its own words in the first failure's message):
    ``known-refusal`` with the defect's finding (and, for a load cell, that its save died of it,
    in the reference reload that restores ModelOpt's state); else None."""
    defect = RESTORE_DRY_RUN
    if (expected != Expected.RESTORE_DRY_RUN or stage.ok or stage.timed_out
            or stage.stage not in (Stage.SAVE, Stage.LOAD)
            or not (stage.cause and defect.seen(stage.cause.message))):
        return None
    return dict(failure(stage), outcome=Outcome.KNOWN_REFUSAL, reason=(
        f"blocked by the save at {blocked_by}, whose reload of its checkpoint died of "
        f"{defect.label}: " if blocked_by else "") + defect.finding)


def judged_behind_restore_defect(expected: str, d: CellDecision) -> Fields:
    """Where ``restore-dry-run`` was expected and the defect did not fire (it is nondeterministic:
    the stage passed, or failed of something else), the cell is judged by the expectation behind
    it (``d.behind``: the same rule without the restore defect), which the record then holds; its
    notice says the defect was expected first and did not fire. Nothing where it was not expected."""
    if expected != Expected.RESTORE_DRY_RUN:
        return {}
    return dict(expected=d.behind, notice=(
        (f"{d.behind_notice}; " if d.behind_notice else "")
        + f"{Expected.RESTORE_DRY_RUN} was expected first ({RESTORE_DRY_RUN.label}, "
        "harness/check/versions.py RESTORE_DRY_RUN) and did not fire: it is "
        f"nondeterministic, so the cell is judged as `{d.behind}`"))


def model_defect_gone(f: Facts, stage: str, topology) -> Fields:
    """A stage passed where megatron-core's model defect was expected: ``unexpected-pass`` (the
    defect is gone) only on evidence that every rank of ``topology`` ran it with validation on."""
    why = missing_evidence(f.evidence, stage, topology, amax=False)
    if why is None:
        return dict(outcome=Outcome.UNEXPECTED_PASS, reason=(
            f"expected megatron-core to refuse the model at {topology.id} ({f.expected}: "
            f"{MTP_POSITION_EMBEDDING.label}), but the {stage} passed: the defect is gone in this "
            "megatron-core"))
    return dict(outcome=Outcome.UNEXPECTED_FAILURE, failed_stage=stage, reason=(
        f"the {stage} passed where megatron-core's refusal was expected ({f.expected}), "
        f"but {why}: no evidence either way"))


def settle_unknown(expected: str, outcome: str, reason: str | None, message: str | None,
                   notice: str | None) -> Fields:
    """A pair with no rule predicts nothing: its cell is ``rule-unknown``, whatever ran (kept in
    the reason), never judged by another pair's rule. A recipe ModelOpt refuses is not a
    checkpoint's answer either way: it stays ``not-quantizable``. Nothing for any other cell."""
    if expected != Expected.RULE_UNKNOWN or outcome in (
            Outcome.SKIPPED, Outcome.INTERRUPTED, Outcome.NOT_QUANTIZABLE):
        return {}
    ran = f"{outcome}: {reason or message or ''}".strip(": ")
    return dict(outcome=Outcome.RULE_UNKNOWN, reason=f"{notice} (ran: {ran[:300]})")


def not_quantizable(f: Facts, save: StageResult) -> Fields:
    """ModelOpt refused to quantize the model with the recipe in the save stage: the cell (and
    every load of that save) is ``not-quantizable``, carrying ModelOpt's exception."""
    return dict(failure(save), outcome=Outcome.NOT_QUANTIZABLE, reason=(
        f"ModelOpt {f.modelopt} refuses to quantize this model with recipe {f.recipe_ref}: "
        f"{(save.cause.message if save.cause else '')[:300]}"))


def interrupted(stage: StageResult | None, signal: str) -> Fields:
    """The controller was stopped: not a product failure, whatever the ranks were doing."""
    if stage is None:
        return dict(outcome=Outcome.INTERRUPTED, reason=f"not started: the run was interrupted ({signal})")
    gone = f"; every rank gone {stage.teardown_s:.2f} s later" if stage.teardown_s is not None else ""
    return dict(outcome=Outcome.INTERRUPTED, failed_stage=stage.stage, teardown_s=stage.teardown_s,
                reason=f"interrupted by {signal} during the {stage.stage} stage{gone}")


def failure(stage: StageResult) -> Fields:
    """A failed stage's first failure as the record holds it."""
    cause = stage.cause
    return dict(failed_stage=stage.stage, exception_type=(cause.exc_type or cause.kind) if cause else None,
                message=((cause.message if cause else "") or stage.summary or "")[:2000],
                failing_key=cause.key if cause else None, first_failure_rank=cause.rank if cause else None,
                secondary_errors=stage.secondaries, teardown_s=stage.teardown_s)


def failed_stage(expected: str, stage: StageResult, expected_stage: str, d: CellDecision) -> Fields:
    """A stage that failed: the bug where ``expected_stage`` was expected, else unexpected."""
    if expected == expected_stage and is_bug(stage.cause, d.behaviour, expert_tensors(d.kinds)):
        return dict(failure(stage), outcome=Outcome.BUG_REPRODUCED)
    timed_out = dict(reason=f"{stage.stage} stage timed out") if stage.timed_out else {}
    return dict(failure(stage), outcome=Outcome.UNEXPECTED_FAILURE, **timed_out)


def save_only(f: Facts, save: StageResult, cell: CellPlan, d: CellDecision) -> Fields:
    """A save-only cell's save that ran to its end, against the cell's expectation."""
    if not save.ok:
        return (known_model_refusal(f.expected, save, cell.save, cell)
                or failed_stage(f.expected, save, Expected.FAIL_SAVE, d))
    if f.expected == Expected.MTP_EMBEDDING_REFUSED:
        return model_defect_gone(f, Stage.SAVE, cell.save)
    if f.expected == Expected.FAIL_SAVE:
        return bug_gone(f, Stage.SAVE, cell.save)
    return dict(outcome=Outcome.PASS)


# What each stage's ranks stamp into their result about where they ran (harness/rank/stages.py).
_RAN = {Stage.SAVE: "saved", Stage.LOAD: "loaded"}


def stage_evidence(stage: StageResult) -> dict | None:
    """What the ranks of a save or load stage reported about where they ran, or None when no
    rank of it reported that (a recorded cell's stage, rebuilt to be judged again)."""
    key = _RAN.get(stage.stage)
    if key is None or not any(key in doc for doc in stage.rank_results.values()):
        return None
    ran = [doc.get(key) or {} for doc in stage.rank_results.values()]
    evidence = {"ranks": len(ran), "topologies": sorted({r["topology"] for r in ran if r.get("topology")}),
                "validated": all(r.get("validated") is True for r in ran)}
    if stage.stage == Stage.SAVE:
        evidence["expert_weight_amax_keys"] = sum(r.get("expert_weight_amax_keys") or 0 for r in ran)
    return evidence


def ran_evidence(evidence: dict | None, *stages: StageResult | None) -> dict | None:
    """``evidence`` (a record's) with what each stage's ranks reported about where they ran; as
    it was where no rank of them reported that."""
    for stage in stages:
        ran = stage_evidence(stage) if stage is not None else None
        if ran is not None:
            evidence = {**(evidence or {}), stage.stage: ran}
    return evidence


def missing_evidence(evidence: dict | None, stage: str, topology, amax: bool = True) -> str | None:
    """Why a record's ``evidence`` does not show that its ``stage`` really ran where the collision
    should have fired (every rank of ``topology``, megatron-core's validation on; a save: per-expert
    weight amax saved), or None when it does. A pass without that is no news about the bug."""
    ev = (evidence or {}).get(stage)
    if not ev:
        return f"the record holds no evidence of where its {stage} stage ran"
    if ev.get("ranks") != topology.world_size or ev.get("topologies") != [topology.id]:
        return (f"{ev.get('ranks')} rank(s) reported a {stage} at {ev.get('topologies')}, not "
                f"{topology.world_size} at {topology.id}")
    if not ev.get("validated"):
        return f"megatron-core's sharding validation was off in the {stage} stage"
    if amax and stage == Stage.SAVE and not ev.get("expert_weight_amax_keys"):
        return "the save wrote no per-expert weight-quantizer amax: nothing could collide"
    return None


def bug_gone(f: Facts, stage: str, topology) -> Fields:
    """A stage passed where the pair's rule predicts the collision: ``unexpected-pass`` (the
    bug is gone) only on positive evidence that it ran where the collision fires; otherwise an
    ``unexpected-failure`` of the harness, with the missing evidence as its reason."""
    why = missing_evidence(f.evidence, stage, topology)
    if why is None:
        return dict(outcome=Outcome.UNEXPECTED_PASS, reason=bug_gone_message(f.expected, f.modelopt))
    return dict(outcome=Outcome.UNEXPECTED_FAILURE, failed_stage=stage, reason=(
        f"the {stage} passed where the collision was expected ({f.expected}), but "
        f"{why}: no evidence about the bug either way"))


def blocked(expected: str, save: StageResult, save_id: str) -> Fields:
    """A load cell whose save failed is not run: ``blocked`` where the save's failure was the
    expectation, else an unexpected failure carrying the save's."""
    reason = f"blocked by the save at {save_id}, which failed; not run"
    if expected != Expected.FAIL_SAVE:
        return dict(failure(save), outcome=Outcome.UNEXPECTED_FAILURE, reason=reason)
    return dict(outcome=Outcome.BLOCKED, reason=reason)


def judged_load(f: Facts, stage: StageResult, cell: CellPlan, d: CellDecision) -> Fields:
    """A load stage that ran to its end, against the cell's expectation."""
    known_gaps = cell.known_gaps
    if not stage.ok:
        judged = failed_stage(f.expected, stage, Expected.FAIL_LOAD, d)
        refused = not stage.timed_out
        if f.expected == Expected.NOT_RESTORED and refused and is_amax_refusal(stage.cause):
            judged["outcome"] = Outcome.BUG_REPRODUCED  # megatron-core refused the checkpoint's amax
        if f.expected == Expected.RESHARD_REFUSED and refused and is_shape_refusal(stage.cause):
            judged.update(outcome=Outcome.KNOWN_REFUSAL, reason=shape_refusal_finding(f.amax_kinds))
        return {**judged, **(known_model_refusal(f.expected, stage, cell.load, cell) or {})}
    verify = judged_verify(stage.rank0.get("verify", {}), f.tier)
    problems = verify_problems(verify, known_gaps)
    return dict(verify=verify, **_verified(f, verify, problems, cell))


def _verified(f: Facts, verify: dict, problems: list[str], cell: CellPlan) -> Fields:
    """A load that passed, by its verify figures (``problems``: what they show wrong)."""
    if f.expected == Expected.NOT_RESTORED:
        if problems:
            return dict(outcome=Outcome.BUG_REPRODUCED, failed_stage=Stage.VERIFY,
                        message="; ".join(problems + [held_after_load(verify)]))
        return dict(outcome=Outcome.UNEXPECTED_PASS, reason=(
            "expected unpatched modelopt to fail restoring this golden checkpoint, but every "
            "tensor matched: older checkpoints now load without the fix"))
    if f.expected == Expected.AMAX_LOST:
        return _amax_lost(verify, cell.known_gaps, problems)
    if f.expected == Expected.MTP_EMBEDDING_REFUSED:
        return model_defect_gone(f, Stage.LOAD, cell.load)
    if f.expected == Expected.FAIL_SAVE:
        return bug_gone(f, Stage.SAVE, cell.save)
    if f.expected == Expected.FAIL_LOAD:
        return bug_gone(f, Stage.LOAD, cell.load)
    if f.expected == Expected.RESHARD_REFUSED and not problems:
        return dict(outcome=Outcome.UNEXPECTED_PASS, reason=(
            "expected megatron-core to refuse the static per-block amax at another expert TP "
            "(global shape mismatch), but the load passed: the limitation is gone"))
    if problems:
        return dict(outcome=Outcome.UNEXPECTED_FAILURE, failed_stage=Stage.VERIFY, message="; ".join(problems))
    return dict(outcome=Outcome.PASS)


def _amax_lost(verify: dict, known_gaps, problems: list[str]) -> Fields:
    """The second bug is reproduced when exactly per-expert weight-quantizer amax went missing."""
    missing = [k for k in verify.get("missing_keys", []) if not any(g.matches(k) for g in known_gaps)]
    key = dict(failing_key=missing[0] if missing else None)
    if missing and all(is_expert_weight_amax(k) for k in missing) and not verify.get("mismatch_count"):
        return dict(key, outcome=Outcome.BUG_REPRODUCED, failed_stage=Stage.VERIFY, message=(
            f"{len(missing)} per-expert weight_quantizer amax absent after load_state_dict "
            "(post-restore re-calibration through expert 0); " + held_after_load(verify)))
    if not problems:
        return dict(key, outcome=Outcome.UNEXPECTED_PASS, reason=(
            "expected per-expert amax to be lost after load_state_dict (second bug) but every "
            "amax survived: that bug is gone in this modelopt"))
    return dict(key, outcome=Outcome.UNEXPECTED_FAILURE, failed_stage=Stage.VERIFY, message="; ".join(problems))


def bug_gone_message(expected: str, modelopt: str | None) -> str:
    return (
        f"expected the per-expert _amax collision ({expected}) but the cell passed: the bug "
        f"no longer reproduces with nvidia-modelopt {modelopt}; the "
        "quarantined Nemotron-3 jobs are candidates for un-quarantine (see `make verdict`)"
    )
