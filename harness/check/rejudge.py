"""A recorded cell judged again by today's rules: its stages rebuilt from what the record kept,
then the one judge (harness/check/judge.py ``judge_cell``).

Why apart from the judge: live judging reads stages that just ran; re-judging must first say
what a record of any age still holds (its first failure, rank 0's verify figures, the versions
its ranks imported). ``harness verdict`` and ``harness equivalence --rejudge`` use it.
"""
from __future__ import annotations

import re
from dataclasses import fields, replace
from typing import Mapping

from harness.check import judge
from harness.check.plan import CellPlan
from harness.records import CauseKind, CellRecord, Outcome, Stage, StageCause, StageResult


# What a record keeps of its judging; re-judging starts from the record without them.
_OUTCOME_FIELDS = ("outcome", "failed_stage", "exception_type", "message", "failing_key",
                   "first_failure_rank", "secondary_errors", "reason", "finding")


def stages_from_record(rec: CellRecord, cell: CellPlan) -> tuple[StageResult | None, StageResult | None, str | None]:
    """(save, load, stopped) as the record's stages reported them, from what it kept: the first
    failure's type, message, key and rank; rank 0's verify figures; the versions the ranks
    imported. Enough for ``judge_cell`` to judge it again."""
    env = {"nvidia-modelopt": rec.modelopt} if rec.modelopt else {}
    outcome, failed = rec.outcome, rec.failed_stage

    def stage(name: str, ok: bool, **kw) -> StageResult:
        return StageResult(stage=name, ok=ok, wall_s=0.0, environment=env, **kw)

    def failure(name: str) -> StageResult:
        cause = StageCause(rank=rec.first_failure_rank, kind=CauseKind.EXCEPTION,
                           exc_type=rec.exception_type, message=rec.message or "",
                           key=rec.failing_key)
        return stage(name, False, cause=cause, secondaries=list(rec.secondary_errors),
                     timed_out=timed_out(rec))

    if outcome == Outcome.INTERRUPTED:
        named = re.search(r"SIG[A-Z]+", rec.reason or "")
        signal = named.group(0) if named else "SIGINT"
        if not failed:
            return None, None, signal
        if failed != Stage.LOAD:
            return stage(failed, False, interrupted=signal), None, None
        return stage(Stage.SAVE, True), stage(Stage.LOAD, False, interrupted=signal), None
    if outcome == Outcome.SKIPPED:
        return None, None, None
    save_name = Stage.GOLDEN if cell.golden else Stage.SAVE
    if failed in (Stage.SAVE, Stage.GOLDEN) or outcome == Outcome.BLOCKED:
        return failure(save_name), None, None
    if cell.load is None:
        return stage(save_name, True), None, None
    if failed == Stage.LOAD:
        return stage(save_name, True), failure(Stage.LOAD), None
    return stage(save_name, True), stage(Stage.LOAD, True, rank_results={"0": {"verify": rec.verify}}), None


def timed_out(rec: CellRecord) -> bool:
    """Whether the record's stage ran past its limit: the fact its run noted
    (``CellRecord.timed_out``). A record made before that field has it only in the reason the
    judge wrote then (judge.failed_stage: ``<stage> stage timed out``)."""
    if rec.timed_out is not None:
        return rec.timed_out
    return "timed out" in (rec.reason or "")  # recorded before 2026-12-06


def rejudge_record(rec: CellRecord | Mapping, cell: CellPlan | None) -> dict:
    """``rec`` (a results.json cell) judged again by ``judge_cell`` under today's rules.

    ``cell``: the plan of the scenario cell it was recorded for (its expectation and known
    gaps), or None when no scenario has it any more: then the record is its own plan and its
    recorded expectation stands."""
    raw = rec.as_dict() if isinstance(rec, CellRecord) else dict(rec)
    rec = CellRecord.of(rec)
    facts = CellPlan.of_record(rec) if cell is None else cell
    if not _rejudgeable(rec, facts):
        return raw  # it kept none of what it was judged from: the record stands
    known = {"scenario": facts.scenario, "cell_id": facts.id, "tier": facts.tier,
             "backend": facts.backend, "save_topology": facts.save.id,
             "load_topology": facts.load.id if facts.load else None, "patch": facts.patch,
             "expected": rec.expected}
    kept = {f.name: getattr(rec, f.name) for f in fields(CellRecord)
            if f.name not in _OUTCOME_FIELDS and f.name in raw}
    save, load, stopped = stages_from_record(rec, facts)
    blank = replace(CellRecord(**{**known, **kept}), verify={})  # figures: the re-judged load's
    new = judge.judge_cell(blank, facts, save, load, stopped)
    stands = {}
    if cell is None and "expected" in raw:  # no scenario has it: its recorded expectation stands
        stands["expected"] = rec.expected
    if rec.outcome == Outcome.SKIPPED:  # nothing ran: the recorded reason stands
        stands["reason"] = rec.reason
    out = {**raw, **replace(new, **stands).as_dict()}
    if not new.verify and rec.verify:
        out["verify"] = rec.verify  # a failed stage reports no figures: keep what was recorded
    return out


def _rejudgeable(rec: CellRecord, cell: CellPlan) -> bool:
    """Whether the record kept what its outcome was decided from: a load that ran its verify
    figures, a failure its failed stage (hand-written or truncated records may keep neither)."""
    outcome = rec.outcome
    if outcome in (Outcome.SKIPPED, Outcome.INTERRUPTED, Outcome.BLOCKED, Outcome.UNEXPECTED_PASS):
        return True  # an unexpected pass stands only on the evidence it kept (judge.bug_gone)
    # rule-unknown without a failed stage: its stages ran and passed (judge.settle_unknown)
    passed = outcome == Outcome.PASS or (outcome == Outcome.RULE_UNKNOWN and not rec.failed_stage)
    if rec.failed_stage == Stage.VERIFY or (passed and cell.load):
        return bool(rec.verify)
    return passed or bool(rec.failed_stage)
