"""One table of NCCL teardown after injected failures, from the results.json
of each `run.sh nccl-teardown` run (one run per failure kind, cells at world 2, 4 and 8).

    python tools/gpu-host/teardown_table.py KIND=results.json [KIND=results.json ...]

Per cell: the stage that failed, the cause (rank, type, first words), how many secondary lines
and which patterns labelled them, and the seconds from the first failure seen to every rank gone.
Figures only: the goal (every rank gone <= 2 s after the first failure, as on gloo) is read, not
asserted.
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.check.results_file import read_results
from harness.launch.failures import secondary_reason
from harness.records import RunResults


def rows(kind: str, path: Path) -> list[str]:
    out = []
    for c in RunResults.of(read_results(path)).cells:
        world = c.save_topology
        # each line "rank N: Type: text"; the pattern that makes it secondary (failures.py)
        labels = sorted({secondary_reason(line) or "by time" for line in c.secondary_errors})
        cause = (f"rank {c.first_failure_rank} {c.exception_type}: "
                 f"{(c.message or '').splitlines()[0][:70] if c.message else ''}")
        gone = f"{c.teardown_s:.2f}" if c.teardown_s is not None else "-"
        out.append(f"| {kind} | {world} | {c.nccl_mode or '-'} | {c.outcome} | {c.failed_stage or '-'} "
                   f"| {cause} | {len(c.secondary_errors)} ({', '.join(labels) or '-'}) | {gone} |")
    return out


def main(argv: list[str]) -> int:
    print("| failure | topology | mode | outcome | stage | cause | secondaries (labels) | all gone s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for item in argv:
        kind, _, path = item.partition("=")
        print("\n".join(rows(kind, Path(path))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
