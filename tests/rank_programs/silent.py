"""Rank program for tests/test_fail_closed.py: a rank that leaves with exit code 0 and reports
nothing, as a rank of a stage whose job another pool's ranks took."""
from __future__ import annotations

import sys

if __name__ == "__main__":
    sys.exit(0)
