"""Seconds from Ctrl-C (SIGINT) or a CI cancel (SIGTERM) to a clean exit of ``python -m harness
run`` on the cpu tier, with every rank of the running stage hung (the worst case: nothing ends
by itself). Prints median and max per signal, the exit codes and leftover processes.
Figures only; tests/test_interrupts.py asserts the behaviour.
"""
from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import interrupt_a_hung_stage, stage_processes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=3)
    args = ap.parse_args()
    print(f"{'signal':8} {'runs':>4} {'median s':>9} {'max s':>7} {'exit codes':>12} leftovers")
    for sig in (signal.SIGINT, signal.SIGTERM):
        times, codes, left = [], set(), 0
        for _ in range(args.count):
            with tempfile.TemporaryDirectory() as tmp:
                proc, _out, gone = interrupt_a_hung_stage(Path(tmp), sig)
                times.append(gone)
                codes.add(proc.returncode)
                left += len(stage_processes(Path(tmp)))
        print(f"{sig.name:8} {len(times):>4} {statistics.median(times):>9.2f} {max(times):>7.2f} "
              f"{','.join(map(str, sorted(codes))):>12} {left}")


if __name__ == "__main__":
    main()
