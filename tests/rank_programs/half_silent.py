"""Rank program for tests/test_fail_closed.py: rank 0 reports its result, every other rank
leaves with exit code 0 and reports nothing; some ranks' evidence is not the world's."""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    if os.environ.get("RANK") == "0":
        from harness.rank.guard import current_stage_dir, write_result

        write_result(0, current_stage_dir(), {"verify": {}})
    sys.exit(0)
