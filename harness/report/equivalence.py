"""Are two runs of the same cells the same result? The rule a faster stage mode (the warm pool)
must meet before it may replace the fresh torchrun per stage: per cell the same
outcome, exception type, failing key, first failing rank and verify figures. Timings, memory,
teardown seconds and free-text messages (they name run directories and pids) may differ; a
run's own id inside a verify figure (a warning naming the checkpoint copied into the run
directory) is read as ``<run>``.

    python -m harness equivalence REFERENCE/results.json CANDIDATE/results.json

``--rejudged``: both runs judged again under today's rules before they are compared (a run
recorded under older rules against a new one: what is compared is then the product's answer,
not the rule generation each was written under).

``--rejudge RUN.results.json ...``: a recorded run against itself judged again under today's
rules (harness/check/judge.py ``rejudge_record``): one line per cell whose outcome changes, with
the reason (a rule change lists what it changes).
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.check.results_file import ResultsFileError, read_results
from harness.records import CellRecord, Outcome, RunResults

SAME = ("outcome", "exception_type", "failing_key", "first_failure_rank", "failed_stage")
# ``--outcomes-only``: the same cells on another transport (NCCL ranks sharing a GPU against
# gloo): which rank reports first and the figures may differ, the product's answer not.
SAME_OUTCOME = ("outcome", "exception_type", "failing_key", "failed_stage")
NOT_COMPARED = (Outcome.INTERRUPTED, Outcome.SKIPPED)  # say nothing about the product


def compared_ids(reference: dict, candidate: dict) -> set[str]:
    """``--outcomes-only``: the cells both runs hold and ran (neither interrupted nor skipped)."""
    ran = [{c.cell_id for c in RunResults.of(d).cells if c.outcome not in NOT_COMPARED}
           for d in (reference, candidate)]
    return ran[0] & ran[1]


def verify_figures(verify: dict | None, run_id: str = "") -> dict:
    """The verify dict without timings, with the run's id read as ``<run>``."""
    def same_run(v):
        if isinstance(v, str) and run_id:
            return v.replace(run_id, "<run>")
        if isinstance(v, list):
            return [same_run(x) for x in v]
        if isinstance(v, dict):
            return {k: same_run(x) for k, x in v.items()}
        return v
    return {k: same_run(v) for k, v in (verify or {}).items() if "time" not in k and not k.endswith("_s")}


def differences(reference: dict, candidate: dict, outcomes_only: bool = False) -> list[str]:
    """One line per difference between two results documents (empty: equivalent).
    ``outcomes_only``: the SAME_OUTCOME fields of the cells both runs hold."""
    ra, rb = RunResults.of(reference), RunResults.of(candidate)
    ref = {c.cell_id: c for c in ra.cells}
    got = {c.cell_id: c for c in rb.cells}
    out = []
    if not outcomes_only:
        out += [f"{cid}: only in the reference run" for cid in sorted(set(ref) - set(got))]
        out += [f"{cid}: only in the candidate run" for cid in sorted(set(got) - set(ref))]
    for cid in sorted(common_ids(reference, candidate, outcomes_only)):
        a, b = ref[cid], got[cid]
        out += [f"{cid}: {k} {getattr(a, k)!r} != {getattr(b, k)!r}"
                for k in (SAME_OUTCOME if outcomes_only else SAME) if getattr(a, k) != getattr(b, k)]
        if outcomes_only:
            continue
        fa = verify_figures(a.verify, ra.run_id if ra.run_id != "?" else "")
        fb = verify_figures(b.verify, rb.run_id if rb.run_id != "?" else "")
        out += [f"{cid}: verify.{k} {fa.get(k)!r} != {fb.get(k)!r}"
                for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    return out


def rejudged_doc(doc: dict, cells: dict | None = None) -> dict:
    """``doc`` with every cell judged again; ``cells``: cell id -> scenario Cell (default: the
    committed scenarios'), a cell no scenario holds keeps its recorded expectation."""
    from harness.check.rejudge import rejudge_record
    from harness.report.verdict import doc_records

    if cells is None:
        from harness.scenario.scenarios import load_all

        cells = {c.id: c for s in load_all() for c in s.cells()}
    records = doc_records(doc)
    return {**doc, "cells": [rejudge_record(r, cells[cid].plan if cid in cells else None)
                             for cid, r in records.items()]}


def outcome_changes(doc: dict, cells: dict | None = None) -> list[tuple[str, str, str, str]]:
    """(cell id, recorded outcome, re-judged outcome, why) for each cell whose outcome changes."""
    from harness.report.verdict import change_reason

    new = {c["cell_id"]: CellRecord.from_json(c) for c in rejudged_doc(doc, cells)["cells"]}
    return [(c.cell_id, c.outcome, new[c.cell_id].outcome, change_reason(c, new[c.cell_id]))
            for c in RunResults.of(doc).cells if new[c.cell_id].outcome != c.outcome]


def rejudge_main(paths: list[str]) -> int:
    """Print every outcome change of the recorded runs; 2 when a bad file, else 0."""
    rc = 0
    for p in paths:
        try:
            doc = read_results(Path(p))
        except ResultsFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            rc = 2
            continue
        changes = outcome_changes(doc)
        print(f"{p}: {len(RunResults.of(doc).cells)} cells, {len(changes)} outcome change(s)")
        for cid, old, new, why in changes:
            print(f"  {cid}: {old} -> {new}: {why}")
    return rc


def common_ids(reference: dict, candidate: dict, outcomes_only: bool = False) -> set[str]:
    """The cells compared: both runs hold them (and, ``outcomes_only``, both ran them)."""
    if outcomes_only:
        return compared_ids(reference, candidate)
    ids = [{c.cell_id for c in RunResults.of(d).cells} for d in (reference, candidate)]
    return ids[0] & ids[1]


def main(args) -> int:
    """Exit 0: equivalent; 1: not; 2: a bad results file, no cell in common, a usage error."""
    if getattr(args, "rejudge", None):
        return rejudge_main(args.rejudge)
    if not (args.reference and args.candidate):
        print("error: equivalence needs REFERENCE and CANDIDATE results.json, or --rejudge RUN ...",
              file=sys.stderr)
        return 2
    try:
        ref, got = (read_results(Path(p)) for p in (args.reference, args.candidate))
    except ResultsFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    only = getattr(args, "outcomes_only", False)
    if not common_ids(ref, got, only):  # "equivalent" over no cell would be a false all-clear
        print(f"error: {args.reference} and {args.candidate} have no cell in common"
              f"{' that both ran' if only else ''}: nothing to compare", file=sys.stderr)
        return 2
    if getattr(args, "rejudged", False):
        ref, got = rejudged_doc(ref), rejudged_doc(got)
    diffs = differences(ref, got, outcomes_only=only)
    cells = len(common_ids(ref, got, True)) if only else len(RunResults.of(ref).cells)
    if diffs:
        print(f"NOT equivalent: {len(diffs)} difference(s) over {cells} {'common' if only else 'reference'} cells")
        print("\n".join(f"  {d}" for d in diffs))
        return 1
    print(f"equivalent: {cells} cells both ran, same outcome, exception, failing key and failed stage"
          if only else f"equivalent: {cells} cells, same outcome, exception, failing key, first "
          "rank and verify figures")
    return 0
