"""Rank program for tests/test_fail_closed.py: a rank that leaves with exit code 0 and reports
nothing, as a rank of a stage whose job another pool's ranks took.

The ranks leave together: each waits (at most WAIT_S) until every rank of the world has started,
because the controller tears a stage down a few seconds after a rank leaves without a result,
and a rank that started late (a loaded machine) would be killed instead of leaving cleanly."""
from __future__ import annotations

import os
import sys
import time

WAIT_S = 30.0

if __name__ == "__main__":
    from harness.rank.guard import current_stage_dir

    started = current_stage_dir() / "silent-started"
    started.mkdir(exist_ok=True)
    (started / os.environ["RANK"]).touch()
    world = int(os.environ["WORLD_SIZE"])
    end = time.monotonic() + WAIT_S
    while len(list(started.iterdir())) < world and time.monotonic() < end:
        time.sleep(0.05)
    sys.exit(0)
