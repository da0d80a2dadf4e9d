"""Per-stage durations of one cpu-tier cell and of the CI suite, medians over repeats.

    python bench/stages.py [--repeats 3] [--suite]

Runs the cpu-reshard cell save tp1-etp1-ep2 -> load tp1-etp1-ep4 ``--repeats`` times through the
real controller (a fresh torchrun per stage) and prints the median of every recorded stage
duration; ``--suite`` also times `make test` once. Figures only, no thresholds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import bounded  # noqa: E402
from harness.records import Outcome  # noqa: E402
from harness.scenario.selections import bench_choice  # noqa: E402

CELL = bench_choice("stages")  # scenarios/selections.toml


def one_cell(root: Path) -> dict:
    from harness.run.cells import run_cells, select_cells
    from harness.scenario.scenarios import load_all

    with open("/dev/null", "w") as quiet:
        doc = run_cells(select_cells(load_all(), [CELL]), root, "bench", out=quiet)
    cell = next(c for c in doc["cells"] if c["load_topology"])
    if cell["outcome"] != Outcome.PASS:
        raise SystemExit(f"bench cell did not pass: {cell['outcome']} {cell['message']}")
    return cell["durations"]


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--suite", action="store_true", help="also time `make test` once")
    args = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            runs.append(one_cell(Path(tmp)))
    keys = sorted({k for r in runs for k in r})
    print(f"cpu-tier cell {CELL}, {args.repeats} repeats (seconds, median / min / max)")
    for k in keys:
        vals = [r[k] for r in runs if k in r]
        print(f"  {k:24} {statistics.median(vals):8.2f} {min(vals):8.2f} {max(vals):8.2f}")
    if args.suite:
        t = time.monotonic()
        rc = bounded.run(["make", "test"], 3600).raise_if_timed_out().returncode
        print(f"make test: {time.monotonic() - t:.0f} s (exit {rc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
