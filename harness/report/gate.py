"""The un-quarantine gate: one job's verdict as an exit code a pipeline can act on
(``python -m harness verdict --job ID --gate [--patched]``; README "The verdict").

Only SAFE lets a job out of quarantine; SAFE WITH PATCH does too when its pipeline applies
the fix (``--patched``: it installs the moe-ckpt-fix wheel and sets MOE_CKPT_FIX=1). Every other
verdict keeps it in, each with its own code, so a log or a CI rule can tell "blocked" from "not
enough evidence" from "something broke".
"""
from __future__ import annotations

from typing import Any, Mapping

from harness.fix import JOB_CHANGE, WHEEL
from harness.records import RunResults
from harness.report import verdict as vd
from harness.report.verdict_text import format_verdicts, no_evidence_line

EXIT_PASS = 0  # SAFE, or SAFE WITH PATCH with --patched: the job may leave quarantine
EXIT_UNEXPECTED = 1  # UNEXPECTED FAILURE (the verdict's own non-zero code)
EXIT_USAGE = 2  # unknown job, bad or mixed results files
EXIT_BLOCKED = 3  # BLOCKED, or SAFE WITH PATCH for a pipeline that does not apply the patch
EXIT_UNDECIDED = 4  # INCOMPLETE, NO EVIDENCE, RULE UNKNOWN, NOT QUANTIZABLE: nothing decides; stay quarantined


class GateUsage(ValueError):
    """The gate was asked something it cannot answer; the message is one line."""


def exit_code(word: str, patched: bool) -> int:
    if word == vd.SAFE or (word == vd.SAFE_WITH_PATCH and patched):
        return EXIT_PASS
    if word == vd.UNEXPECTED:
        return EXIT_UNEXPECTED
    if word in (vd.BLOCKED, vd.SAFE_WITH_PATCH):
        return EXIT_BLOCKED
    return EXIT_UNDECIDED


def job_of(job_id: str) -> vd.Job:
    jobs = vd.load_quarantine().jobs
    for j in jobs:
        if j.id == job_id:
            return j
    raise GateUsage(f"unknown job {job_id!r}; known jobs: {', '.join(j.id for j in jobs)}")


def judge_job(docs: list[tuple[str, Mapping[str, Any]]], job_id: str) -> vd.Verdict:
    """The job's verdict from every given run together (newer runs win for the same cell). The
    runs must share one (modelopt, megatron-core) pair: the pair the job's pipeline runs."""
    runs = [RunResults.of(doc) for _, doc in docs]
    pairs = sorted({vd.run_pair(r) for r in runs})
    if len(pairs) > 1:
        raise GateUsage(f"the gate judges one (modelopt, megatron-core) pair, the one the job "
                        f"runs; these results hold {len(pairs)}: {', '.join(pairs)}")
    verdicts = vd.judge_records(vd.merged_records(runs))
    return next(v for v in verdicts if v.job.id == job_id)


def gate_line(v: vd.Verdict, patched: bool, code: int) -> str:
    j = v.job
    release = (f"drop the job's allow-to-fail line (quarantined for {j.issue.split()[0]}), then "
               "remove its [[jobs]] entry from scenarios/quarantine.toml")
    if code == EXIT_PASS and v.word == vd.SAFE_WITH_PATCH:
        return (f"gate {j.id}: {v.word} -> exit 0: it may leave quarantine with the fix "
                f"(--patched). Next step: in {j.pipeline}, (1) install the fix wheel, "
                f"`pip install --no-deps {WHEEL}` (built by `make fix-wheel`), in the job's image "
                f"or before its script; (2) set MOE_CKPT_FIX=1 in the job's variables; (3) {release}")
    if code == EXIT_PASS:
        return (f"gate {j.id}: {v.word} -> exit 0: it may leave quarantine as it is. Next step: in "
                f"{j.pipeline} {release}")
    if v.word == vd.SAFE_WITH_PATCH:
        why = (f"safe only with the fix; pass --patched once the job's pipeline applies it "
               f"({JOB_CHANGE}; README 'Using the fix')")
    else:
        why = v.detail
    return f"gate {j.id}: {v.word} -> exit {code}: stays quarantined: {why}"


def main(docs: list[tuple[str, Mapping[str, Any]]], job_id: str, patched: bool) -> int:
    """Print the job's verdict and its gate line; the exit code above."""
    v = judge_job(docs, job_id)
    code = exit_code(v.word, patched)
    if not v.ran:
        print(no_evidence_line(v.tier))
        return code
    print(format_verdicts(f"== gate on {len(docs)} results file(s)", [v]))
    print(gate_line(v, patched, code))
    return code
