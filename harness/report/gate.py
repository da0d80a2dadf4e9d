"""The un-quarantine gate: one job's verdict as an exit code a pipeline can act on
(``python -m harness verdict --job ID --gate [--patched]``; README "The verdict").

Only SAFE lets a job out of quarantine; SAFE WITH PATCH does too when its pipeline applies
the fix (``--patched``: it installs the moe-ckpt-fix wheel and sets MOE_CKPT_FIX=1). Every other
verdict keeps it in, each with its own code, so a log or a CI rule can tell "blocked" from "not
enough evidence" from "something broke".

Its evidence: the results files given (``--results``), or every committed record of one
(nvidia-modelopt, megatron-core) pair (``--modelopt V [--mcore V]``), found through
harness/report/records_index.py. It prints which files it judged and which cell came from which,
names interrupted runs and the cells still missing, and when nothing decides, what would.
"""
from __future__ import annotations

from typing import Any, Mapping

from harness.check.release import release
from harness.fix import BUILT_WHEEL, JOB_CHANGE
from harness.records import RunResults
from harness.report import verdict as vd
from harness.report.records_index import Pair
from harness.report.exits import (EXIT_BLOCKED, EXIT_CODES, EXIT_PASS, EXIT_UNDECIDED,  # noqa: F401
                                  EXIT_UNEXPECTED, EXIT_USAGE, exit_code)
from harness.report.verdict_text import format_verdicts

class GateUsage(ValueError):
    """The gate was asked something it cannot answer; the message is one line."""


def job_of(job_id: str) -> vd.Job:
    jobs = vd.load_quarantine().jobs
    for j in jobs:
        if j.id == job_id:
            return j
    raise GateUsage(f"unknown job {job_id!r}; known jobs: {', '.join(j.id for j in jobs)}")


def pair_of_runs(runs: list[RunResults]) -> Pair | None:
    """The one (modelopt, megatron-core) pair the runs' cells imported; None for no cell at all.
    GateUsage for several: the gate judges the pair the job runs."""
    # a local build of a release is that release (check/release.py): a run's ran cells record
    # 0.19.2+<commit>, its skipped or interrupted ones the run's 0.19.2; one pair
    pairs = sorted({Pair(release(c.modelopt), release(c.mcore))
                    for r in runs for c in vd.doc_records(r).values()}, key=lambda p: p.sort_key)
    if len(pairs) > 1:
        raise GateUsage(f"the gate judges one (modelopt, megatron-core) pair, the one the job "
                        f"runs; these results hold {len(pairs)}: {', '.join(map(str, pairs))}")
    return pairs[0] if pairs else None


def fix_runs(pair: Pair | None, job: vd.Job, scenarios: list | None = None) -> bool:
    """Whether harness.fix patches ``pair`` for what the job's fix scenario needs (no pair: yes);
    ``scenarios``: the scenarios already read."""
    return vd.fix_patches(pair, vd.fix_parts(job, scenarios))[0]


def judge_job(docs: list[tuple[str, Mapping[str, Any]]], job_id: str,
              quarantine: vd.Quarantine | None = None, scenarios: list | None = None,
              patched: bool = False) -> tuple[vd.Verdict, dict[str, str]]:
    """The job's verdict from every given run together (newer runs win for the same cell), and
    the file each evidence cell's record came from. The runs must share one pair.
    ``quarantine``: other job profiles than scenarios/quarantine.toml's; ``scenarios``: the
    scenarios already read; ``patched``: for a pipeline with the fix (verdict.fix_patches)."""
    runs = [(label, RunResults.of(doc)) for label, doc in docs]
    pair = pair_of_runs([r for _, r in runs])
    sources = vd.merged_sources(runs)
    verdicts = vd.judge_records({cid: rec for cid, (_, rec) in sources.items()}, quarantine,
                                scenarios, patched, pair)
    v = next(v for v in verdicts if v.job.id == job_id)
    return v, {e.cell_id: sources[e.cell_id][0] for e in v.evidence if e.cell_id in sources}


def interrupted_runs(v: vd.Verdict, docs: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The labels of the runs that were stopped early and hold a cell of the job."""
    ids = {e.cell_id for e in v.evidence}
    return [label for label, doc in docs if RunResults.of(doc).incomplete
            and any(c.cell_id in ids for c in RunResults.of(doc).cells)]


def _host(tier: str, world: int) -> str:
    from harness.tiers import facts

    ranks = "one per GPU" if facts(tier).gpu_per_rank else "sharing the GPUs"
    return (f"a host with a CUDA GPU and Transformer Engine (tier {tier}, {world} ranks {ranks}; "
            "docs/gpu-host.md)")


def what_would_decide(job: vd.Job, pair: Pair | None, patched: bool, missing: list[str],
                      look_in_committed: bool = False, kind_without_rule: str | None = None) -> str:
    """One line: the scenario and cells that would decide the job for ``pair``, and the host;
    ``look_in_committed``: first, whether the committed records of the pair hold them."""
    from harness.check.versions import rules_for

    if kind_without_rule:  # no run decides it before a rule exists
        return ("what would decide: a rule for that amax kind in harness/check/versions.py "
                "(KindRule, read from both packages' sources), then the job's cells with its "
                "recipe run on a GPU host")
    if look_in_committed and pair is not None and _committed_hold(pair, missing):
        return (f"what would decide: the committed records of that pair hold them: python -m "
                f"harness verdict --job {job.id} --gate --modelopt {pair.modelopt} --mcore "
                f"{pair.mcore}" + (" --patched" if patched else ""))
    rules = rules_for(pair.modelopt, pair.mcore) if pair else None
    under = f"with {pair}" if pair else "with the pair the job runs"
    if rules is not None and not rules.known:
        return (f"what would decide: a rule for {pair} in harness/check/versions.py (none yet: its "
                "cells would be judged rule-unknown), then its cells run on a GPU host")
    witness, fix = vd.evidence_cells(job)
    cells = fix if fix and patched and rules is not None and fix_runs(pair, job) else witness
    name = cells[0].scenario.name
    todo = [c for c in cells if c.id in missing] or cells
    if len(todo) == len(cells):
        which = f"--cells '*save={job.save.id},*'"
    else:
        which = " ".join(f"--cells '{c.id}'" for c in todo)
    world = max(c.world for c in todo)
    return (f"what would decide: python -m harness run --scenario {name} {which} {under}, on "
            f"{_host(cells[0].scenario.tier, world)}")


def _committed_hold(pair: Pair, cell_ids: list[str]) -> bool:
    """Whether a committed record of ``pair`` ran one of ``cell_ids``."""
    from harness.report import records_index

    wanted = set(cell_ids)
    return any(c.cell_id in wanted and c.outcome not in vd.NOT_RUN
               for e in records_index.of_pair(records_index.read_index(), pair) for c in e.run.cells)


def next_step(v: vd.Verdict, pair: Pair | None, patched: bool) -> str:
    """Every change the job's pipeline needs to leave quarantine: the package, the fix's wheel
    and switch (or their removal where the fix refuses the release), the allow-to-fail line."""
    from harness.check.versions import rules_for

    j = v.job
    if pair is None:
        pkg = "the nvidia-modelopt judged"
    else:
        pkg = f"nvidia-modelopt=={pair.modelopt} (with megatron-core {pair.mcore}, the pair judged)"
    if patched and fix_runs(pair, j):
        change = (f"install {pkg} in the job's image and the moe-ckpt-fix wheel, `pip install "
                  f"--no-deps {BUILT_WHEEL}` (built by `make fix-wheel`); set MOE_CKPT_FIX=1 in its "
                  "environment (README 'Using the fix')")
    elif patched and pair is not None and rules_for(pair.modelopt, pair.mcore).fix_parts_apply:
        change = (f"install {pkg}; remove the moe-ckpt-fix wheel and MOE_CKPT_FIX (this release has "
                  "the fix's other parts itself, and its remaining part changes nothing this job's "
                  "recipe saves; no record shows the job's cells with it)")
    elif patched:
        change = (f"install {pkg}; remove the moe-ckpt-fix wheel and MOE_CKPT_FIX (the fix refuses this "
                  "release and would stop the job)")
    else:
        change = f"install {pkg}; MOE_CKPT_FIX stays unset"
    return (f"Next step: in {j.pipeline}, {change}; remove the job's allow-to-fail line "
            f"(allow_failure, quarantined for {j.issue.split()[0]}); then remove its [[jobs]] "
            "entry from scenarios/quarantine.toml")


def gate_line(v: vd.Verdict, patched: bool, code: int, pair: Pair | None = None,
              look_in_committed: bool = False) -> str:
    j = v.job
    if code == EXIT_PASS:
        how = "with the fix (--patched)" if v.word == vd.SAFE_WITH_PATCH else "as it is"
        caveat = f" (NOT at {', '.join(v.refused)}: a known refusal, README)" if v.refused else ""
        return (f"gate {j.id}: {v.word} -> exit 0: it may leave quarantine {how}{caveat}. "
                f"{next_step(v, pair, patched)}")
    if v.word == vd.SAFE_WITH_PATCH:
        why = (f"safe only with the fix; pass --patched once the job's pipeline applies it "
               f"({JOB_CHANGE}; README 'Using the fix')")
    else:
        why = v.detail
    if v.word == vd.INCOMPLETE:
        why = f"cannot decide: {len(missing_cells(v, pair))} cell(s) still missing (listed above)"
    if code == EXIT_UNDECIDED:
        decide = what_would_decide(j, pair, patched, missing_cells(v, pair), look_in_committed,
                                   v.kind_without_rule)
        why += f"; {decide}"
    return f"gate {j.id}: {v.word} -> exit {code}: stays quarantined: {why}"


def _files_lines(v: vd.Verdict, docs: list[tuple[str, Mapping[str, Any]]], sources: dict[str, str],
                 pair: Pair | None, patched: bool) -> list[str]:
    """Which files were judged, which the job's cells came from, interrupted runs, missing cells."""
    mode = "patched (--patched)" if patched else "unpatched"
    head = (f"== gate {v.job.id} on {pair or 'no pair (no cells)'}, pipeline {mode}: judged {len(docs)} "
            "results file(s) together (newer runs win for the same cell)")
    used: dict[str, int] = {}
    for label in sources.values():
        used[label] = used.get(label, 0) + 1
    lines = [head, f"  the job's {len(v.evidence)} cells came from {len(used)} of them:"]
    lines += [f"    {label}: {n} cell(s)" for label, n in used.items()]
    cut = interrupted_runs(v, docs)
    if cut:
        lines.append(f"  interrupted (incomplete) runs, their cut cells count as missing: {', '.join(cut)}")
    missing = missing_cells(v, pair)
    lines.append(f"  cells still missing: {', '.join(missing) if missing else 'no cell'}")
    return lines


def missing_cells(v: vd.Verdict, pair: Pair | None, scenarios: list | None = None) -> list[str]:
    """The job's cells no file holds (or only cut): the fix's only where the fix applies;
    ``scenarios``: the scenarios already read."""
    fix = fix_runs(pair, v.job, scenarios)
    return [e.cell_id for e in v.evidence if e.outcome in vd.NOT_RUN
            and (e.role == vd.Role.WITNESS or fix)]


def main(docs: list[tuple[str, Mapping[str, Any]]], job_id: str, patched: bool,
         committed: bool = False) -> int:
    """Print which files were judged, the job's verdict and its gate line; the exit code above.
    A job none of whose cells the files hold is one line, saying what would decide it.
    ``committed``: the docs are every committed record of their pair (``main_committed``)."""
    pair = pair_of_runs([RunResults.of(doc) for _, doc in docs])
    v, sources = judge_job(docs, job_id, patched=patched)
    code = exit_code(v.word, patched)
    if not v.ran and not v.kind_without_rule:
        why = (f"none of the {len(docs)} results file(s) ({pair or 'no cells'}) holds a cell of this "
               "job that ran" if docs else "no results")
        missing = missing_cells(v, pair)
        print(f"gate {job_id}: {v.word} -> exit {code}: stays quarantined: {why}; "
              f"{what_would_decide(v.job, pair, patched, missing, not committed)}")
        return code
    print("\n".join(_files_lines(v, docs, sources, pair, patched)))
    print(format_verdicts("== verdict", [v]))
    print(gate_line(v, patched, code, pair, not committed))
    return code


def parse_pair(modelopt: str, mcore: str | None) -> Pair:
    """``--modelopt V [--mcore V]`` as a pair; GateUsage for a version that is not one."""
    from packaging.version import InvalidVersion, Version

    from moe_ckpt_fix.releases import REFERENCE_MCORE

    mcore = mcore or REFERENCE_MCORE
    for flag, v in (("--modelopt", modelopt), ("--mcore", mcore)):
        try:
            Version(v)
        except InvalidVersion:
            raise GateUsage(f"{flag} {v!r} is not a version (e.g. --modelopt 0.48.0rc1 --mcore "
                            f"{REFERENCE_MCORE})") from None
    return Pair(release(modelopt), release(mcore))  # the releases records name (check/release.py)


def main_committed(job_id: str, modelopt: str, mcore: str | None, patched: bool,
                   runs_dir=None) -> int:
    """The gate on every committed record of (``modelopt``, ``mcore``): found in
    tests/data/runs/ by the versions the records name. A pair no record holds is one line."""
    from harness.report import records_index

    pair = parse_pair(modelopt, mcore)
    index = records_index.read_index(*([runs_dir] if runs_dir else []))
    entries = records_index.of_pair(index, pair)
    if not entries:
        known = ", ".join(f"{p.modelopt} + {p.mcore}" for p in records_index.pairs(index))
        job = job_of(job_id)
        print(f"gate {job_id}: {vd.NO_EVIDENCE} -> exit {EXIT_UNDECIDED}: stays quarantined: no committed "
              f"record of {pair} (committed pairs: {known}); "
              f"{what_would_decide(job, pair, patched, [])}")
        return EXIT_UNDECIDED
    return main([(e.label, e.run) for e in entries], job_id, patched, committed=True)
