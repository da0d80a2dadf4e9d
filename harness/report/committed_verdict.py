"""Bare ``python -m harness verdict`` where the jobs' cells cannot run (no GPU): each quarantined
job's verdict from the committed records (tests/data/runs/) of the installed (nvidia-modelopt,
megatron-core) pair, judged by today's rules as ``verdict --job ID --gate --modelopt V --mcore M``
judges them, and what would change it. The exit code is bare ``verdict``'s (README, cli.py
EXIT_CODES): 1 when a job is UNEXPECTED FAILURE, 0 when one gets a verdict that decides, else 4.
"""
from __future__ import annotations

from harness.check.release import release
from harness.report import gate, records_index
from harness.report import verdict as vd
from harness.report.records_index import Pair
from harness.report.verdict_text import format_verdicts, no_evidence_line


def installed_pair() -> Pair | None:
    """The installed pair as the releases records name (harness/check/release.py); None when
    either package is missing."""
    from harness.check.versions import installed_mcore, installed_modelopt

    modelopt, mcore = installed_modelopt(), installed_mcore()
    return Pair(release(modelopt), release(mcore)) if modelopt and mcore else None


def what_would_change(v: vd.Verdict, pair: Pair, others: list[Pair]) -> str:
    """One line: what would change the job's verdict on this machine's pair."""
    if v.word == vd.SAFE_WITH_PATCH:
        head = ("the fix in the job's pipeline: the gate with --patched then passes "
                f"({gate.JOB_CHANGE}; README 'Using the fix')")
    elif v.word in (vd.SAFE, vd.BLOCKED, vd.UNEXPECTED):
        head = (f"another release: {'; '.join(map(str, others)) or 'none committed'} "
                f"(python -m harness verdict --job {v.job.id} --gate --modelopt V --mcore M)")
    else:
        head = gate.what_would_decide(v.job, pair, False, gate.missing_cells(v, pair), False,
                                      v.kind_without_rule)
    return (f"what would change it: {head}; or new evidence of {pair}: its cells run on a GPU host "
            "(docs/gpu-host.md), where bare `verdict` runs them")


def main(tier: str, job: str | None = None) -> int:
    """Print each job's verdict (``job``: that one) from the committed records of the installed
    pair and what would change it; the exit code above."""
    pair = installed_pair()
    index = records_index.read_index()
    entries = records_index.of_pair(index, pair) if pair else []
    if not entries:
        known = ", ".join(f"{p.modelopt} + {p.mcore}" for p in records_index.pairs(index))
        print(f"{no_evidence_line(tier)}; no committed record of the installed pair "
              f"({pair or 'nvidia-modelopt or megatron-core missing'}; committed pairs: {known})")
        return gate.EXIT_UNDECIDED
    docs = [(e.label, e.run) for e in entries]
    others = [p for p in records_index.pairs(index) if p != pair]
    print(f"no cell of the quarantined jobs runs here (tier {tier} needs a GPU host): their "
          f"verdicts from the {len(docs)} committed results file(s) of the installed {pair}, "
          "judged by today's rules, for a pipeline without the fix")
    verdicts = []
    for j in vd.load_quarantine().jobs:
        if job is not None and j.id != job:
            continue
        v, _ = gate.judge_job(docs, j.id)
        verdicts.append(v)
        print(format_verdicts(f"== {j.id} on {pair} (committed records)", [v]))
        print(f"  gate: exit {gate.exit_code(v.word, False)} for a pipeline without the fix, "
              f"{gate.exit_code(v.word, True)} with it (--patched)")
        print(f"  {what_would_change(v, pair, others)}")
    if any(v.word == vd.UNEXPECTED for v in verdicts):
        return gate.EXIT_UNEXPECTED
    decides = [v for v in verdicts if gate.exit_code(v.word, patched=True) != gate.EXIT_UNDECIDED]
    return 0 if decides else gate.EXIT_UNDECIDED
