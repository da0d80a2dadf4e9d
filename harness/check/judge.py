"""A cell's outcome from its stage results, under the rules of the ModelOpt that ran.

Pure judging, in one place: ranks measure (harness/rank/), the controller runs stages
(harness/run/cell.py) and hands the typed results to ``judge_cell``, once per cell. Recorded
runs are judged again by the same function (harness/check/rejudge.py ``rejudge_record``, used by
``harness verdict`` and ``harness equivalence --rejudge``); the matrix and the reports read the
outcome a record holds and judge nothing themselves.
"""
from __future__ import annotations

import copy
from dataclasses import replace

from harness.check.decision import CellDecision, decide
from harness.check.defects import MODEL_DEFECTS, MTP_POSITION_EMBEDDING, RESTORE_DRY_RUN
from harness.check.keys import is_expert_weight_amax
from harness.check.logits import topology_finding
from harness.check.plan import CellPlan
from harness.check.refusals import (expert_tensors, is_amax_refusal, is_bug, is_not_quantizable,
                                    is_shape_refusal, shape_refusal_finding)
from harness.check.verify_figures import held_after_load, judged_verify, verify_problems
from harness.check.versions import installed_mcore
from harness.records import (FIX_PARTS_ENV_KEY, CellRecord, Expected, Outcome, Stage, StageCause,
                             StageResult)


def judge_cell(rec: CellRecord, cell: CellPlan, save: StageResult | None, load: StageResult | None,
               stopped: str | None = None, decision: CellDecision | None = None) -> CellRecord:
    """The cell's record judged from what ran: ``save`` (None: not run), ``load`` (None: not run
    or a save-only cell) and ``stopped`` (the signal that stopped the controller before the save).

    Returns a new record (``rec`` is not touched) with the decision of the pair the ranks imported
    and the kinds the save recorded (``decision``, the controller's from before the stages ran, is
    reused when those are its own), the outcome, failure, judged verify figures and the
    cross-topology finding."""
    d, decided = ran_decision(rec, cell, save, load, decision)
    rec = replace(copy.deepcopy(rec), **decided)
    for stage in (save, load):
        if stage is not None:
            note_evidence(rec, stage)
    if save is None or (d.skip and not stopped):
        if stopped:
            interrupted(rec, None, stopped)
        else:
            rec.outcome, rec.reason = Outcome.SKIPPED, d.skip or "not run"
    elif save.interrupted:
        interrupted(rec, save, save.interrupted)
    elif is_not_quantizable(save.cause):
        not_quantizable(rec, save)
    elif cell.load is None:
        save_only(rec, save, cell.save, d, cell)
    elif not save.ok:
        if known_restore_refusal(rec, save, blocked_by=cell.save.id):
            pass
        elif not known_model_refusal(rec, save, cell.save, cell, blocked_by=cell.save.id):
            judged_behind_restore_defect(rec, d)
            blocked(rec, save, cell.save.id)
    elif load is None:
        rec.outcome, rec.reason = Outcome.SKIPPED, "load stage not run"
    elif load.interrupted:
        interrupted(rec, load, load.interrupted)
    else:
        _load(rec, load, cell, d)
        rec.finding = topology_finding(rec.verify)
    settle_unknown(rec)
    return rec


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


def decision_fields(d: CellDecision) -> dict:
    """The decision's record fields: pair, rules, expectation, notice, forecast disagreement."""
    return {"modelopt": d.modelopt, "mcore": d.mcore, "expectations": d.expectations,
            "expected": d.expected, "notice": d.notice, "forecast_disagreement": d.forecast_disagreement}


def note_decision(rec: CellRecord, d: CellDecision) -> None:
    """The decision's fields written into a new record (the controller's, before any stage ran)."""
    for name, value in decision_fields(d).items():
        setattr(rec, name, value)


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


def known_model_refusal(rec: CellRecord, stage: StageResult, topology, cell: CellPlan,
                        blocked_by: str | None = None) -> bool:
    """A failed stage that is the model defect the cell expects: ``known-refusal`` with the
    defect's finding (and, for a load cell, that its save was the stage refused)."""
    if rec.expected != Expected.MTP_EMBEDDING_REFUSED or stage.timed_out:
        return False
    defect = model_defect_seen(stage.cause, topology, cell)
    if defect is None:
        return False
    fill_failure(rec, stage)
    rec.outcome = Outcome.KNOWN_REFUSAL
    rec.reason = (f"blocked by the save at {blocked_by}, which megatron-core refused: "
                  if blocked_by else "") + defect.finding
    return True


def known_restore_refusal(rec: CellRecord, stage: StageResult, blocked_by: str | None = None) -> bool:
    """A failed stage that is the restore defect the cell expects (``restore-dry-run``:
    harness/check/versions.py RESTORE_DRY_RUN, by its own words in the first failure's message):
    ``known-refusal`` with the defect's finding (and, for a load cell, that its save died of it,
    in the reference reload that restores ModelOpt's state)."""
    defect = RESTORE_DRY_RUN
    if (rec.expected != Expected.RESTORE_DRY_RUN or stage.ok or stage.timed_out
            or stage.stage not in (Stage.SAVE, Stage.LOAD)
            or not (stage.cause and defect.seen(stage.cause.message))):
        return False
    fill_failure(rec, stage)
    rec.outcome = Outcome.KNOWN_REFUSAL
    rec.reason = (f"blocked by the save at {blocked_by}, whose reload of its checkpoint died of "
                  f"{defect.label}: " if blocked_by else "") + defect.finding
    return True


def judged_behind_restore_defect(rec: CellRecord, d: CellDecision) -> None:
    """Where ``restore-dry-run`` was expected and the defect did not fire (it is nondeterministic:
    the stage passed, or failed of something else), the cell is judged by the expectation behind
    it (``d.behind``: the same rule without the restore defect), which the record then holds; its
    notice says the defect was expected first and did not fire."""
    if rec.expected != Expected.RESTORE_DRY_RUN:
        return
    rec.expected = d.behind
    rec.notice = ((f"{d.behind_notice}; " if d.behind_notice else "")
                  + f"{Expected.RESTORE_DRY_RUN} was expected first ({RESTORE_DRY_RUN.label}, "
                  "harness/check/versions.py RESTORE_DRY_RUN) and did not fire: it is "
                  f"nondeterministic, so the cell is judged as `{d.behind}`")


def model_defect_gone(rec: CellRecord, stage: str, topology) -> None:
    """A stage passed where megatron-core's model defect was expected: ``unexpected-pass`` (the
    defect is gone) only on evidence that every rank of ``topology`` ran it with validation on."""
    why = missing_evidence(rec, stage, topology, amax=False)
    if why is None:
        rec.outcome = Outcome.UNEXPECTED_PASS
        rec.reason = (f"expected megatron-core to refuse the model at {topology.id} ({rec.expected}: "
                      f"{MTP_POSITION_EMBEDDING.label}), but the {stage} passed: the "
                      "defect is gone in this megatron-core")
        return
    rec.outcome, rec.failed_stage = Outcome.UNEXPECTED_FAILURE, stage
    rec.reason = (f"the {stage} passed where megatron-core's refusal was expected ({rec.expected}), "
                  f"but {why}: no evidence either way")


def settle_unknown(rec: CellRecord) -> None:
    """A pair with no rule predicts nothing: its cell is ``rule-unknown``, whatever ran (kept in
    the record), never judged by another pair's rule. A recipe ModelOpt refuses is not a
    checkpoint's answer either way: it stays ``not-quantizable``."""
    if rec.expected == Expected.RULE_UNKNOWN and rec.outcome not in (
            Outcome.SKIPPED, Outcome.INTERRUPTED, Outcome.NOT_QUANTIZABLE):
        ran = f"{rec.outcome}: {rec.reason or rec.message or ''}".strip(": ")
        rec.outcome, rec.reason = Outcome.RULE_UNKNOWN, f"{rec.notice} (ran: {ran[:300]})"


def not_quantizable(rec: CellRecord, save: StageResult) -> None:
    """ModelOpt refused to quantize the model with the recipe in the save stage: the cell (and
    every load of that save) is ``not-quantizable``, carrying ModelOpt's exception."""
    fill_failure(rec, save)
    rec.outcome = Outcome.NOT_QUANTIZABLE
    rec.reason = (f"ModelOpt {rec.modelopt} refuses to quantize this model with recipe "
                  f"{rec.recipe_ref}: {(save.cause.message if save.cause else '')[:300]}")


def interrupted(rec: CellRecord, stage: StageResult | None, signal: str) -> None:
    """The controller was stopped: not a product failure, whatever the ranks were doing."""
    rec.outcome = Outcome.INTERRUPTED
    if stage is None:
        rec.reason = f"not started: the run was interrupted ({signal})"
        return
    rec.failed_stage, rec.teardown_s = stage.stage, stage.teardown_s
    gone = f"; every rank gone {stage.teardown_s:.2f} s later" if stage.teardown_s is not None else ""
    rec.reason = f"interrupted by {signal} during the {stage.stage} stage{gone}"


def fill_failure(rec: CellRecord, stage: StageResult) -> None:
    cause = stage.cause
    rec.failed_stage = stage.stage
    rec.exception_type = (cause.exc_type or cause.kind) if cause else None
    rec.message = ((cause.message if cause else "") or stage.summary or "")[:2000]
    rec.failing_key = cause.key if cause else None
    rec.first_failure_rank = cause.rank if cause else None
    rec.secondary_errors = stage.secondaries
    rec.teardown_s = stage.teardown_s


def failed_stage(rec: CellRecord, stage: StageResult, expected_stage: str, d: CellDecision) -> None:
    """A stage that failed: the bug where ``expected_stage`` was expected, else unexpected."""
    fill_failure(rec, stage)
    if rec.expected == expected_stage and is_bug(stage.cause, d.behaviour, expert_tensors(d.kinds)):
        rec.outcome = Outcome.BUG_REPRODUCED
    else:
        rec.outcome = Outcome.UNEXPECTED_FAILURE
        if stage.timed_out:
            rec.reason = f"{stage.stage} stage timed out"


def save_only(rec: CellRecord, save: StageResult, topology, d: CellDecision,
              cell: CellPlan | None = None) -> None:
    if known_restore_refusal(rec, save):
        return
    judged_behind_restore_defect(rec, d)
    if not save.ok:
        if cell is None or not known_model_refusal(rec, save, topology, cell):
            failed_stage(rec, save, Expected.FAIL_SAVE, d)
    elif rec.expected == Expected.MTP_EMBEDDING_REFUSED:
        model_defect_gone(rec, Stage.SAVE, topology)
    elif rec.expected == Expected.FAIL_SAVE:
        bug_gone(rec, Stage.SAVE, topology)
    else:
        rec.outcome = Outcome.PASS


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


def note_evidence(rec: CellRecord, stage: StageResult) -> None:
    evidence = stage_evidence(stage)
    if evidence is not None:
        rec.evidence = {**(rec.evidence or {}), stage.stage: evidence}


def missing_evidence(rec: CellRecord, stage: str, topology, amax: bool = True) -> str | None:
    """Why the record does not show that its ``stage`` really ran where the collision should
    have fired (every rank of ``topology``, megatron-core's validation on; a save: per-expert
    weight amax saved), or None when it does. A pass without that is no news about the bug."""
    ev = (rec.evidence or {}).get(stage)
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


def bug_gone(rec: CellRecord, stage: str, topology) -> None:
    """A stage passed where the pair's rule predicts the collision: ``unexpected-pass`` (the
    bug is gone) only on positive evidence that it ran where the collision fires; otherwise an
    ``unexpected-failure`` of the harness, with the missing evidence as its reason."""
    why = missing_evidence(rec, stage, topology)
    if why is None:
        rec.outcome, rec.reason = Outcome.UNEXPECTED_PASS, bug_gone_message(rec)
        return
    rec.outcome, rec.failed_stage = Outcome.UNEXPECTED_FAILURE, stage
    rec.reason = (f"the {stage} passed where the collision was expected ({rec.expected}), but "
                  f"{why}: no evidence about the bug either way")


def blocked(rec: CellRecord, save: StageResult, save_id: str) -> None:
    """A load cell whose save failed is not run."""
    rec.outcome = Outcome.BLOCKED
    rec.reason = f"blocked by the save at {save_id}, which failed; not run"
    if rec.expected != Expected.FAIL_SAVE:
        rec.outcome = Outcome.UNEXPECTED_FAILURE
        fill_failure(rec, save)


def _load(rec: CellRecord, stage: StageResult, cell: CellPlan, d: CellDecision) -> None:
    """A load stage against the cell's expectation."""
    known_gaps = cell.known_gaps
    if known_restore_refusal(rec, stage):  # its restore, before anything else the load meets
        return
    judged_behind_restore_defect(rec, d)
    if not stage.ok:
        failed_stage(rec, stage, Expected.FAIL_LOAD, d)
        if rec.expected == Expected.NOT_RESTORED and not stage.timed_out and is_amax_refusal(stage.cause):
            rec.outcome = Outcome.BUG_REPRODUCED  # megatron-core refused the checkpoint's amax
        if rec.expected == Expected.RESHARD_REFUSED and not stage.timed_out and is_shape_refusal(stage.cause):
            rec.outcome, rec.reason = Outcome.KNOWN_REFUSAL, shape_refusal_finding(rec)
        known_model_refusal(rec, stage, cell.load, cell)
        return
    rec.verify = judged_verify(stage.rank0.get("verify", {}), rec.tier)
    problems = verify_problems(rec.verify, known_gaps)
    if rec.expected == Expected.NOT_RESTORED:
        if problems:
            rec.outcome, rec.failed_stage = Outcome.BUG_REPRODUCED, Stage.VERIFY
            rec.message = "; ".join(problems + [held_after_load(rec.verify)])
        else:
            rec.outcome = Outcome.UNEXPECTED_PASS
            rec.reason = ("expected unpatched modelopt to fail restoring this golden checkpoint, "
                          "but every tensor matched: older checkpoints now load without the fix")
    elif rec.expected == Expected.AMAX_LOST:
        _amax_lost(rec, known_gaps, problems)
    elif rec.expected == Expected.MTP_EMBEDDING_REFUSED:
        model_defect_gone(rec, Stage.LOAD, cell.load)
    elif rec.expected == Expected.FAIL_SAVE:
        bug_gone(rec, Stage.SAVE, cell.save)
    elif rec.expected == Expected.FAIL_LOAD:
        bug_gone(rec, Stage.LOAD, cell.load)
    elif rec.expected == Expected.RESHARD_REFUSED and not problems:
        rec.outcome = Outcome.UNEXPECTED_PASS
        rec.reason = ("expected megatron-core to refuse the static per-block amax at another expert "
                      "TP (global shape mismatch), but the load passed: the limitation is gone")
    elif problems:
        rec.outcome, rec.failed_stage = Outcome.UNEXPECTED_FAILURE, Stage.VERIFY
        rec.message = "; ".join(problems)
    else:
        rec.outcome = Outcome.PASS


def _amax_lost(rec: CellRecord, known_gaps, problems: list[str]) -> None:
    """The second bug is reproduced when exactly per-expert weight-quantizer amax went missing."""
    missing = [k for k in rec.verify.get("missing_keys", [])
               if not any(g.matches(k) for g in known_gaps)]
    rec.failing_key = missing[0] if missing else None
    if missing and all(is_expert_weight_amax(k) for k in missing) and not rec.verify.get("mismatch_count"):
        rec.outcome, rec.failed_stage = Outcome.BUG_REPRODUCED, Stage.VERIFY
        rec.message = (f"{len(missing)} per-expert weight_quantizer amax absent after "
                       "load_state_dict (post-restore re-calibration through expert 0); "
                       + held_after_load(rec.verify))
    elif not problems:
        rec.outcome = Outcome.UNEXPECTED_PASS
        rec.reason = ("expected per-expert amax to be lost after load_state_dict (second bug) "
                      "but every amax survived: that bug is gone in this modelopt")
    else:
        rec.outcome, rec.failed_stage = Outcome.UNEXPECTED_FAILURE, Stage.VERIFY
        rec.message = "; ".join(problems)


def bug_gone_message(rec: CellRecord) -> str:
    return (
        f"expected the per-expert _amax collision ({rec.expected}) but the cell passed: the bug "
        f"no longer reproduces with nvidia-modelopt {rec.modelopt}; the "
        "quarantined Nemotron-3 jobs are candidates for un-quarantine (see `make verdict`)"
    )
