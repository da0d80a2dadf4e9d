"""The gate's exit codes and the verdict word each comes from: what `verdict --gate`, `verdict` and
the README's exit-code table share (gate.py decides, verdict_text.py prints).
"""
from __future__ import annotations

from harness.report import verdict as vd

EXIT_PASS = 0  # SAFE, or SAFE WITH PATCH with --patched: the job may leave quarantine
EXIT_UNEXPECTED = 1  # UNEXPECTED FAILURE (the verdict's own non-zero code)
EXIT_USAGE = 2  # unknown job, bad or mixed results files, a version that is no version
EXIT_BLOCKED = 3  # BLOCKED, or SAFE WITH PATCH for a pipeline that does not apply the patch
EXIT_UNDECIDED = 4  # INCOMPLETE, NO EVIDENCE, RULE UNKNOWN, NOT QUANTIZABLE, no record of the pair: stay quarantined

# What each exit code means, as `verdict --help` and the README print it.
EXIT_CODES = (
    (EXIT_PASS, "SAFE, or SAFE WITH PATCH with --patched: the job may leave quarantine; the gate "
                "prints what to change in its pipeline"),
    (EXIT_UNEXPECTED, "UNEXPECTED FAILURE"),
    (EXIT_USAGE, "usage: unknown job, --modelopt without --gate, a version that is not one, a bad "
                 "results file, results of two pairs"),
    (EXIT_BLOCKED, "BLOCKED, or SAFE WITH PATCH without --patched"),
    (EXIT_UNDECIDED, "nothing decides: INCOMPLETE, NO EVIDENCE, RULE UNKNOWN, or no committed "
                     "record of the pair (an unknown version); it says what would"),
)


def exit_code(word: str, patched: bool) -> int:
    if word == vd.SAFE or (word == vd.SAFE_WITH_PATCH and patched):
        return EXIT_PASS
    if word == vd.UNEXPECTED:
        return EXIT_UNEXPECTED
    if word in (vd.BLOCKED, vd.SAFE_WITH_PATCH):
        return EXIT_BLOCKED
    return EXIT_UNDECIDED
