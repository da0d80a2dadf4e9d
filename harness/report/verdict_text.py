"""The quarantine verdict as text (``python -m harness verdict``): a block per results file
and per (modelopt, megatron-core) pair of several, the checkpoints users already have, what
each release does with them, and one line per job no file decides.

Why apart from the rules (harness/report/verdict.py): what decides a job and how it is shown
change for different reasons; the gate (gate.py) reuses the block of one job.
"""
from __future__ import annotations

from typing import Any, Mapping

from harness.check.results_file import INCOMPLETE_LINE
from harness.records import CellRecord, Outcome, RunResults
from harness.report.jobs import load_quarantine
from harness.report.summary import cause
from harness.report.verdict import (INCOMPLETE, NO_EVIDENCE, UNDECIDED, Record, Verdict, doc_records,
                                    judge_doc, judge_records, merged_records, run_modelopt,
                                    run_pair)

# Where a reader with no evidence at hand finds the committed evidence, judged.
COMMITTED_EVIDENCE = ("the committed evidence, judged: docs/evidence.md, or python -m harness verdict "
                      "--job ID --gate --modelopt V [--mcore V]")


def existing_checkpoints(records: Mapping[str, Record], goldens: str) -> list[str]:
    """What unpatched loads of the committed goldens (scenario ``goldens``) gave: the
    checkpoints users already have."""
    from harness.check.verify_figures import held_after_load

    lines = []
    for cid, rec in sorted(records.items()):
        rec = CellRecord.of(rec)
        if rec.scenario != goldens or rec.outcome == Outcome.SKIPPED:
            continue
        what = (held_after_load(rec.verify) if rec.verify
                else cause(rec) or rec.reason or "")
        lines.append(f"      {cid.split('[', 1)[1].rstrip(']')}: {rec.outcome} - {what}")
    return (["    existing checkpoints (tests/golden, loaded unpatched):"] + lines) if lines else []


def checkpoint_advice(modelopt_version: str) -> list[str]:
    """Per kind of existing checkpoint, what this release does with it and the command
    (harness/golden/forecast.py: the rules of harness/check/versions.py)."""
    from harness.golden.forecast import advice

    return advice(None if modelopt_version == "unknown" else modelopt_version)


def _versions(run: RunResults) -> str:
    keys = ("torch", "megatron-core", "transformer-engine", "gpu")
    return ", ".join(f"{k} {run.version(k)}" for k in keys if run.version(k)) or "versions unknown"


def format_verdicts(title: str, verdicts: list[Verdict]) -> str:
    lines = [title]
    for vd in verdicts:
        j = vd.job
        lines.append(f"  {j.id}: {vd.word} - {vd.detail}")
        lines.append(f"    {j.name}; pipeline {j.pipeline}; issue {j.issue}; review by {j.review_by}")
        grid = ", ".join(t.id for t in j.profile.loads)
        lines.append(f"    shapes: save {j.save.id} -> load {j.load.id} (production {j.production}, "
                     f"see assumption in scenarios/quarantine.toml); reload grid {grid}; tier {vd.tier}")
        lines.append(f"    recipe: {j.profile.recipe}; modules: {j.profile.modules}")
        if j.profile.not_modelled:
            lines.append(f"    not modelled: {j.profile.not_modelled}")
        for e in vd.evidence:
            lines.append(f"      [{e.role}] {e.cell_id}: {e.outcome}" + (f"  ({e.note})" if e.note else ""))
    return "\n".join(lines)


def no_evidence_line(tier: str, files: int = 0) -> str:
    """The one line for a verdict with no evidence at all: where evidence comes from. ``files``:
    the results files given, none of which holds a cell of the jobs that ran; 0: nothing was
    given and nothing could run here (the jobs' cells need a GPU host)."""
    if files:
        return (f"NO EVIDENCE: none of the {files} results file(s) holds a cell of the quarantined "
                f"jobs' profiles (scenarios/quarantine.toml) that ran; {COMMITTED_EVIDENCE}")
    return (f"NO EVIDENCE: the quarantined jobs' cells run on tier {tier}: earning evidence needs "
            f"a GPU host (docs/gpu-host.md); {COMMITTED_EVIDENCE}")


def verdict_report(docs: list[tuple[str, Mapping[str, Any]]], job: str | None = None
                   ) -> tuple[str, list[Verdict]]:
    """Text for each (label, results doc), then for each modelopt version with several docs the
    verdict of their records together (newer runs win for the same cell). Returns all verdicts.

    A job the evidence cannot decide (INCOMPLETE, NO EVIDENCE) is left out of each block and
    summarised once at the end, only when no block decides it; with no evidence for any job at
    all, the text is one line (``no_evidence_line``). ``job``: that job only."""
    out, every = [], []
    goldens = load_quarantine().goldens
    runs = [(label, RunResults.of(doc)) for label, doc in docs]

    def block(title: str, vds: list[Verdict], group: list[RunResults],
              records: Mapping[str, Record], advice: list[str]) -> None:
        vds = [v for v in vds if job is None or v.job.id == job]
        every.extend(vds)
        decided = [v for v in vds if v.word not in UNDECIDED]
        checkpoints = existing_checkpoints(records, goldens)
        if decided or checkpoints:
            out.append("\n".join([format_verdicts(title, decided), *_incomplete(group),
                                  *checkpoints, *advice]))

    for label, run in runs:
        block(f"== {run_pair(run)}: {label} (run {run.run_id}, tier {run.tier or '?'}; "
              f"{_versions(run)})", judge_doc(run), [run], doc_records(run),
              checkpoint_advice(run_modelopt(run)))
    groups: dict[str, list[RunResults]] = {}
    for _, run in runs:
        groups.setdefault(run_pair(run), []).append(run)
    for version, group in groups.items():
        if len(group) < 2:
            continue
        records = merged_records(group)
        ids = ", ".join(str(r.run_id) for r in group)
        block(f"== {version}: all {len(group)} runs together ({ids}; newer runs win for "
              "the same cell)", judge_records(records), group, records, [])
    out += _undecided(every, len(runs))
    return "\n\n".join(out), every


def _undecided(verdicts: list[Verdict], files: int) -> list[str]:
    """One summary line per job that no results file decides; one line in all when no job has
    any evidence."""
    if not verdicts:
        return []
    if not any(v.ran for v in verdicts):
        skipped_here = any(e.outcome == Outcome.SKIPPED for v in verdicts for e in v.evidence)
        return [no_evidence_line(verdicts[0].tier, 0 if skipped_here else files)]
    decided = {v.job.id for v in verdicts if v.word not in UNDECIDED}
    lines = []
    for job_id in dict.fromkeys(v.job.id for v in verdicts):
        if job_id in decided:
            continue
        vds = [v for v in verdicts if v.job.id == job_id]
        word = INCOMPLETE if any(v.word == INCOMPLETE for v in vds) else NO_EVIDENCE
        ran = {c for v in vds for c in v.ran}
        never = [e.cell_id for e in vds[0].evidence if e.cell_id not in ran]
        why = (f"never run: {', '.join(never)}" if never else
               "each cell ran somewhere, but no one run or (modelopt, megatron-core) pair holds "
               "them all")
        lines.append(f"  {job_id}: {word} in every one of {files} results file(s); {why}; "
                     f"tier {vds[0].tier} cells run only on a GPU host (docs/gpu-host.md)")
    return ["\n".join(["== jobs no results file decides", *lines])] if lines else []


def _incomplete(runs: list[RunResults]) -> list[str]:
    """A warning line when evidence comes from a run that stopped early (cells may be missing)."""
    stopped = [str(r.run_id) for r in runs if r.incomplete]
    if not stopped:
        return []
    return [f"  WARNING: {INCOMPLETE_LINE}" + (f" (run {', '.join(stopped)})" if len(runs) > 1 else "")]


def main(docs: list[tuple[str, Mapping[str, Any]]], job: str | None = None) -> int:
    """Print the verdicts of ``docs`` (label, results.json). Exit 1 when any job is UNEXPECTED,
    else the gate's code for "nothing decides" (4) when no job gets a verdict that decides
    (SAFE, SAFE WITH PATCH, BLOCKED), else 0."""
    from harness.report import exits

    text, verdicts = verdict_report(docs, job)
    print(text)
    if any(v.unexpected for v in verdicts):
        return exits.EXIT_UNEXPECTED
    decides = [v for v in verdicts if exits.exit_code(v.word, patched=True) != exits.EXIT_UNDECIDED]
    return 0 if decides else exits.EXIT_UNDECIDED
