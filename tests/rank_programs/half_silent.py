"""Rank program for tests/test_fail_closed.py: rank 0 reports its result, every other rank
leaves with exit code 0 and reports nothing; some ranks' evidence is not the world's.

A silent rank waits (at most WAIT_S) for rank 0's result first: the controller tears a stage down
soon after a rank leaves without a result, and rank 0 must have reported by then."""
from __future__ import annotations

import os
import sys
import time

WAIT_S = 30.0

if __name__ == "__main__":
    from harness.rank.guard import current_stage_dir, write_result

    stage = current_stage_dir()
    if os.environ.get("RANK") == "0":
        write_result(0, stage, {"verify": {}})
    else:
        end = time.monotonic() + WAIT_S
        while not (stage / "ranks" / "rank0.json").exists() and time.monotonic() < end:
            time.sleep(0.05)
    sys.exit(0)
