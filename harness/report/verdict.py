"""Un-quarantine verdict for the two nmm-sandbox jobs (scenarios/quarantine.toml).

Each job names its save and load topology. Its evidence is the cells of the unpatched witness
scenario and of the patched fix scenario at exactly those topologies (the save-only cell and the
save -> load cell). Per job and per modelopt version the verdict is one of:

- ``SAFE``: the witness cells come back ``unexpected-pass`` / ``pass``: the bug no longer
  reproduces at the job's shapes on unpatched modelopt, so the job can leave quarantine as is.
- ``SAFE WITH PATCH``: every fix cell at the job's shapes passes (with the witness, where
  present, still reproducing): the job can leave quarantine with the patch (moe_ckpt_fix).
- ``BLOCKED``: the witness reproduces the bug at the job's shapes and no complete passing fix
  evidence is at hand.
- ``INCOMPLETE``: the evidence at hand cannot decide (cells missing); nothing is guessed.
- ``NO EVIDENCE``: every evidence cell was skipped (a GPU tier on a machine without a GPU).
- ``NOT QUANTIZABLE``: ModelOpt refuses to quantize the model with the job's recipe (its
  exception named): no checkpoint was written, so nothing about the bug can be decided.
- ``UNEXPECTED FAILURE``: an evidence cell failed in a way the grid did not predict; the only
  verdict that makes ``main`` exit non-zero.

Every recorded cell is judged again by the one judge under today's rules (``rejudged``; the
note says so where the outcome changes), so evidence recorded before a rule change still counts.

Evidence comes from results.json files (``--results``, judged one by one and, where several
share a modelopt version, together), or, with none given, from running the cells now. These are
the rules; the text a reader sees is harness/report/verdict_text.py, and ``--job ID --gate``
harness/report/gate.py.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from harness.check.refusals import SHAPE_REFUSAL_FINDING
from harness.check.release import as_release
from harness.check.results_file import read_results
from harness.report.summary import cause
from harness.report.jobs import (QUARANTINE, Job, Quarantine, by_kinds, file_recipe_kinds,  # noqa: F401
                                 job_cells, load_quarantine, stand_ins)
from harness.records import CellRecord, Outcome, RunResults, Stage
from harness.scenario.cells import Cell, Scenario
from harness.machine import skip_kind
from harness.scenario.scenarios import load_all
# The verdict's words (harness/report/verdict_words.py), read by the reports as vd.<NAME>.
from harness.report.verdict_words import (BLOCKED, INCOMPLETE, MISSING, NO_EVIDENCE,  # noqa: F401
                                          NO_RULE, NOT_QUANTIZABLE, NOT_RUN, SAFE,
                                          SAFE_WITH_PATCH, UNDECIDED, UNEXPECTED, Evidence, Role,
                                          Verdict)

Record = CellRecord | Mapping[str, Any]  # a results.json cell, read by CellRecord.of


def with_pair(rec: Record) -> CellRecord:
    """``rec`` naming its (modelopt, megatron-core) pair. A record that names no modelopt
    predates per-cell versions (2026-12-02): every such run had the then-pinned pair, 0.47.0 +
    0.19.2 (their results.json "versions" say so); one without megatron-core predates pairs
    (all on 0.19.2). A record that names an unknown version stays unknown."""
    from moe_ckpt_fix.releases import LAST_BUGGY, REFERENCE_MCORE

    rec = CellRecord.of(rec)
    return replace(rec, modelopt=rec.modelopt or LAST_BUGGY, mcore=rec.mcore or REFERENCE_MCORE)


def pair_of(rec: Record) -> str:
    """``0.47.0 + mcore 0.19.2``: the pair a verdict line holds for."""
    from moe_ckpt_fix.releases import REFERENCE_MCORE

    rec = CellRecord.of(rec)
    return f"{rec.modelopt} + mcore {rec.mcore or REFERENCE_MCORE}"


def _note(rec: CellRecord | None) -> str:
    """What a reader needs of a re-judged record: its cause, its notice, and where the save's
    kinds disagreed with the recipe's forecast."""
    if rec is None:
        return ""
    return "; ".join(x for x in (cause(rec), rec.notice, rec.forecast_disagreement) if x)


def rejudged(cell: Cell, rec: Record | None) -> tuple[CellRecord | None, str]:
    """``rec`` judged again by the one judge (harness/check/judge.py ``rejudge_record``) under
    today's rules, and a note saying so when that changes its outcome."""
    from harness.check.rejudge import rejudge_record

    if not rec:
        return None, ""
    rec = CellRecord.of(rec)
    if rec.outcome in (Outcome.SKIPPED, Outcome.INTERRUPTED):
        return rec, ""
    new = CellRecord.from_json(rejudge_record(with_pair(rec), cell.plan))
    parts = []
    if new.outcome != rec.outcome:
        parts.append(f"recorded as {rec.outcome}; re-judged {new.outcome} under the current rules: "
                     f"{change_reason(rec, new)}")
    elif rec.expected and rec.expected != new.expected:
        parts.append(f"recorded expecting {rec.expected}; the grid now expects {new.expected}")
    return new, "; ".join(parts)


MODEL_NOT_RECORDED = "its model is not recorded (a record before the field): taken as the profile's"


def of_the_profile(cell: Cell, rec: CellRecord | None, note: str) -> tuple[CellRecord | None, str]:
    """``rec`` when the model it recorded is the one the profile's scenario builds; otherwise no
    evidence (None), and the note names the difference. A record made before models were
    recorded is taken as today, and the note says so."""
    if rec is None or rec.outcome in NOT_RUN:
        return rec, note
    if rec.model is None:
        return rec, "; ".join(x for x in (note, MODEL_NOT_RECORDED) if x)
    diff = cell.scenario.size.difference(rec.model)
    if diff is None:
        return rec, note
    return None, f"not evidence for this profile: its model differs ({diff})"


def _on(kinds: dict[str, list[str]], families) -> dict[str, list[str]]:
    return {f: sorted(k) for f, k in sorted(kinds.items()) if families is None or f in families}


def of_the_kinds(job: Job, cell: Cell, rec: CellRecord | None, note: str) -> tuple[CellRecord | None, str]:
    """For a cell standing in for a job owner's recipe file by its kinds (jobs.py ``by_kinds``):
    ``rec`` when the amax kinds its save made (recorded; before the field, its recipe's forecast)
    are those the file makes on the cell's model; otherwise no evidence, and the note says how
    they differ. Any other cell: ``rec`` as it is."""
    if rec is None or rec.outcome in NOT_RUN or not by_kinds(job, cell.scenario):
        return rec, note
    from harness.check.expectation import kinds_for

    mine = _on(file_recipe_kinds(job), cell.plan.families)
    ran = kinds_for(cell.plan, rec.amax_kinds, rec.modelopt)
    if ran is not None and _on(ran, cell.plan.families) == mine:
        return rec, "; ".join(x for x in (note, f"stands in for {job.profile.recipe} by its amax kinds {mine}") if x)
    return None, (f"not evidence for this profile: its save made amax kinds {ran}, recipe "
                  f"{job.profile.recipe} makes {mine}")


def unruled_kind(job: Job, cells: list[Cell], records: Mapping[str, CellRecord]) -> str | None:
    """For a job owner's recipe file standing in by kinds: one line naming an amax kind of the
    file that the rule of a pair its records ran under has no rule for (what a cell with those
    kinds is judged by: harness/check/expectation.py), else None."""
    from harness.check.versions import rules_for

    for c in cells:
        rec = records.get(c.id)
        if rec is None or not by_kinds(job, c.scenario) or rec.outcome in NOT_RUN:
            continue
        rec = with_pair(rec)
        behaviour = rules_for(rec.modelopt, rec.mcore)
        if not behaviour.known:
            continue  # the pair's own notice decides (rule-unknown)
        for family, kinds in _on(file_recipe_kinds(job), c.plan.families).items():
            for kind in kinds:
                if behaviour.kind_rule(kind, family, tuple(rec.fix_parts or ())) is None:
                    return (f"under {pair_of(rec)}: recipe {job.profile.recipe}: no rule for amax "
                            f"kind {kind!r} of the {family} under {behaviour.label} "
                            "(harness/check/versions.py)")
    return None


def change_reason(old: Record, new: Record) -> str:
    """Why re-judging changed a record's outcome, in one line."""
    from harness.check.logits import topology_finding

    old, new = CellRecord.of(old), CellRecord.of(new)
    v = new.verified
    ct = v.cross_topology
    parts = []
    if old.failed_stage == Stage.VERIFY and "logits" in (old.message or ""):
        flips = f", {ct['routing_flips']} routing flip(s)" if ct.get("routing_flips") is not None else ""
        parts.append(f"its failure ({old.message}{flips}) compared the save topology's logits "
                     "with the load topology's: that is the cross-topology figure, now reported, "
                     f"not asserted, and the state was bit-exact ({v.mismatch_count} "
                     "mismatches)")
        parts.append(f"logits asserted: {v.logits_asserted or 'none (no logits figures in this record)'}"
                     + (f" rel {v.logits_rel_diff:.3g}" if v.logits_rel_diff is not None else ""))
    if new.expected != old.expected:
        parts.append(f"expectation {old.expected or None} -> {new.expected or None}")
    if new.message and new.message != old.message:
        parts.append(new.message)
    finding = topology_finding(v.figures)
    if finding:
        parts.append(finding)
    return "; ".join(parts) or "the rules changed"


def judge(job: Job, witness: list[Cell], fix: list[Cell], records: Mapping[str, Record],
          patched: bool = False) -> Verdict:
    """The verdict for one job from ``records`` (cell id -> results.json record). An interrupted
    cell says nothing about the product: it counts as missing, and is shown as interrupted.
    ``patched``: for a pipeline with the fix, which the unpatched witness alone cannot block:
    where it reproduces the bug and fix cells are missing, nothing decides (INCOMPLETE)."""
    records = {cid: CellRecord.of(r) for cid, r in records.items()}
    rows, notes = [], {}
    stopped = {cid for cid, r in records.items() if r.outcome == Outcome.INTERRUPTED}
    for role, cells in ((Role.WITNESS, witness), (Role.FIX, fix)):
        for c in cells:
            rec, notes[c.id] = rejudged(c, None if c.id in stopped else records.get(c.id))
            rec, notes[c.id] = of_the_profile(c, rec, notes[c.id])
            rec, notes[c.id] = of_the_kinds(job, c, rec, notes[c.id])
            rows.append((c, role, rec))
    evidence = [Evidence(c.id, role, r.outcome if r else Outcome.INTERRUPTED if c.id in stopped else MISSING,
                         "; ".join(x for x in (notes[c.id], _note(r)) if x))
                for c, role, r in rows]
    tier = (witness or fix)[0].scenario.tier
    # A known refusal (not the collision) keeps a job safe at the shapes that pass, and is said.
    refused = sorted({c.load.id for c, _, r in rows
                      if r and r.outcome == Outcome.KNOWN_REFUSAL and c.load is not None})
    v = lambda word, detail: Verdict(job, word, detail, tier, evidence, refused)  # noqa: E731

    def ran(role):
        return [r.outcome for _, ro, r in rows if ro == role and r and r.outcome != Outcome.SKIPPED]

    def complete(role):
        return all(r and r.outcome != Outcome.SKIPPED for _, ro, r in rows if ro == role)

    unruled = unruled_kind(job, witness + fix, records)
    if unruled:  # the job's own kinds: nothing can be predicted for them
        out = v(NO_RULE, f"its recipe's amax kinds have no rule {unruled}")
        out.kind_without_rule = unruled
        return out
    bad = [e.cell_id for e in evidence if e.outcome == Outcome.UNEXPECTED_FAILURE]
    if bad:
        return v(UNEXPECTED, f"{len(bad)} evidence cell(s) failed unexpectedly: {', '.join(bad)}")
    unquantized = [r for _, _, r in rows if r and r.outcome == Outcome.NOT_QUANTIZABLE]
    if unquantized:
        return v(NOT_QUANTIZABLE, f"{len(unquantized)} evidence cell(s): {unquantized[0].reason}")
    unruled = [e.cell_id for e in evidence if e.outcome == Outcome.RULE_UNKNOWN]
    if unruled:
        first = next(r for _, _, r in rows if r and r.outcome == Outcome.RULE_UNKNOWN)
        why = f"under {pair_of(first)}: " + ((first.notice or "").strip()
                                             or "no rule for the pair (harness/check/versions.py)")
        return v(NO_RULE, f"{len(unruled)} evidence cell(s) ran without a prediction "
                          f"({', '.join(unruled)}): {why}")
    present = [r for _, _, r in rows if r]
    if present and not ran(Role.WITNESS) and not ran(Role.FIX):
        reason = next((r.reason for r in present if r.reason), "") or ""
        kind = skip_kind(reason)
        why = f"tier {tier} needs a GPU" if kind and kind.lacks_gpus else reason
        return v(NO_EVIDENCE, f"on this machine ({why})")
    w, f = ran(Role.WITNESS), ran(Role.FIX)
    reproduced = Outcome.BUG_REPRODUCED in w
    missing_fix = [e.cell_id for e in evidence
                   if e.role == Role.FIX and e.outcome in NOT_RUN]
    # each known refusal's own finding (the static amax's global shape, megatron-core's MTP
    # position embedding), as the judge wrote it
    findings = sorted({r.reason for c, _, r in rows if r and r.outcome == Outcome.KNOWN_REFUSAL
                       and c.load is not None and r.reason}) or [SHAPE_REFUSAL_FINDING]
    caveat = (f"; NOT at {', '.join(refused)}: {'; '.join(findings)}" if refused else "")
    if w and complete(Role.WITNESS) and all(o in (Outcome.PASS, Outcome.UNEXPECTED_PASS, Outcome.KNOWN_REFUSAL)
                                            for o in w) and set(w) != {Outcome.KNOWN_REFUSAL}:
        how = ("the bug no longer reproduces (this version was expected to fail)"
               if Outcome.UNEXPECTED_PASS in w else "this version's own rules expect it to pass, and it does")
        return v(SAFE, f"fixed upstream: unpatched, save {job.save.id} / loads {len(job.profile.loads)} "
                       f"pass: {how}{caveat}")
    if complete(Role.FIX) and f and all(o in (Outcome.PASS, Outcome.KNOWN_REFUSAL) for o in f) \
            and set(f) != {Outcome.KNOWN_REFUSAL}:
        unpatched = ("unpatched the witness still reproduces the bug (BLOCKED without the patch)"
                     if reproduced else "no unpatched evidence here")
        return v(SAFE_WITH_PATCH, f"every patched cell at the job's shapes passes; {unpatched}{caveat}")
    if reproduced and patched and fix and missing_fix:
        return v(INCOMPLETE, "the unpatched witness reproduces the bug; with the fix nothing decides "
                             f"yet: missing {', '.join(missing_fix)}")
    if reproduced:
        fix_state = (f"fix evidence incomplete, missing {', '.join(missing_fix)}" if missing_fix
                     else f"fix cells: {', '.join(f)}")
        return v(BLOCKED, f"the unpatched witness reproduces the bug at the job's shapes; {fix_state}")
    missing = [e.cell_id for e in evidence if e.outcome in NOT_RUN]
    return v(INCOMPLETE, "cannot decide from this evidence"
             + (f"; missing {', '.join(missing)}" if missing else
                f"; outcomes {', '.join(e.outcome for e in evidence)}"))


def evidence_cells(job: Job, scenarios: list[Scenario] | None = None) -> tuple[list[Cell], list[Cell]]:
    """(witness cells, fix cells) of ``job``: its profile's scenarios at its save and reloads."""
    witness, fix = stand_ins(job, {s.name: s for s in (scenarios or load_all())})
    return job_cells(job, witness), (job_cells(job, fix) if fix else [])


def fix_parts(job: Job, scenarios: list[Scenario] | None = None) -> tuple[str, ...]:
    """The parts of harness.fix the job's fix scenario needs (its ``fix_parts``; () with none)."""
    _, fix = stand_ins(job, {s.name: s for s in (scenarios or load_all())})
    return tuple(fix.fix_parts) if fix else ()


def fix_patches(pair, parts: tuple[str, ...]) -> tuple[bool, bool]:
    """(whether harness.fix patches ``pair`` for a fix scenario needing ``parts``, whether with
    only parts the release lacks: a patched pipeline is then judged on the fix cells alone, its
    unpatched witness saying nothing about what the part changes). No pair: any pair the fix
    runs on."""
    from harness.check.versions import rules_for

    if pair is None:
        return True, False
    rules = rules_for(pair.modelopt, pair.mcore)
    return rules.fix_runs(parts), rules.fix_parts_only(parts)


def judge_records(records: Mapping[str, Record], quarantine: Quarantine | None = None,
                  scenarios: list[Scenario] | None = None, patched: bool = False,
                  pair=None) -> list[Verdict]:
    """Every job's verdict; ``patched``: for a pipeline with the fix on ``pair`` (judge's
    ``patched`` where the fix runs there, on the fix cells alone where it has only parts the
    release lacks: fix_patches)."""
    q = quarantine or load_quarantine()
    scenarios = scenarios or load_all()
    out = []
    for j in q.jobs:
        witness, fix = evidence_cells(j, scenarios)
        runs, parts_only = (fix_patches(pair, tuple(fix[0].scenario.fix_parts) if fix else ())
                            if patched else (False, False))
        out.append(judge(j, [] if fix and parts_only else witness, fix, records, runs))
    return out


def doc_records(doc: RunResults | Mapping[str, Any]) -> dict[str, CellRecord]:
    """cell id -> record; records from before version-aware runs take the doc's modelopt; every
    version read as its release (``0.19.2+<sha>`` is 0.19.2: harness/check/release.py)."""
    run = RunResults.of(doc)
    return {c.cell_id: as_release(replace(c, modelopt=c.modelopt or run_modelopt(run),
                                          mcore=c.mcore or _mcore(run))) for c in run.cells}


def judge_doc(doc: RunResults | Mapping[str, Any], **kw) -> list[Verdict]:
    return judge_records(doc_records(doc), **kw)


def run_modelopt(run: RunResults) -> str:
    return str(run.version("nvidia-modelopt") or "unknown")


def _mcore(run: RunResults) -> str:
    """The run's megatron-core; runs before pairs were recorded all used the reference."""
    from moe_ckpt_fix.releases import REFERENCE_MCORE

    return str(run.version("megatron-core") or REFERENCE_MCORE)


def run_pair(run: RunResults) -> str:
    return f"(modelopt {run_modelopt(run)}, megatron-core {_mcore(run)})"


def merged_records(runs: list[RunResults]) -> dict[str, CellRecord]:
    """The records of several runs together: for the same cell the newer run wins, except that
    a skipped or interrupted cell never hides a result."""
    return {cid: rec for cid, (_, rec) in merged_sources([("", r) for r in runs]).items()}


def merged_sources(runs: list[tuple[str, RunResults]]) -> dict[str, tuple[str, CellRecord]]:
    """``merged_records`` of (label, run) pairs, each winning record with its run's label."""
    records: dict[str, tuple[str, CellRecord]] = {}
    for label, run in sorted(runs, key=lambda lr: (str(lr[1].created), str(lr[1].run_id))):
        for cid, c in doc_records(run).items():
            if c.outcome not in (Outcome.SKIPPED, Outcome.INTERRUPTED) or cid not in records:
                records[cid] = (label, c)
    return records


def read_docs(paths: list[str | Path]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, doc) per results.json; ResultsFileError (one line naming the file) on a bad one."""
    return [(str(p), read_results(p)) for p in paths]


def cells_to_run() -> list[Cell]:
    """The witness and fix cells of every quarantined job: what a verdict needs run."""
    q, scenarios = load_quarantine(), load_all()
    by_name = {s.name: s for s in scenarios}
    ids = {c.id for j in q.jobs for s in stand_ins(j, by_name) if s for c in job_cells(j, s)}
    return [c for s in scenarios for c in s.cells() if c.id in ids]  # scenario order, once each


