"""Every scenario cell: run it for real and judge the outcome against its expectation."""
from __future__ import annotations

import pytest

from harness.machine import skip_reason
from harness.outcomes import PASSING_OUTCOMES, UNDECIDED_OUTCOMES


def test_cell(cell, run_dir):
    reason = skip_reason(cell.scenario.tier, cell.world, cell.scenario.size)
    if reason:
        pytest.skip(reason)
    from harness.run.cell import run_cell

    rec = run_cell(cell, run_dir)
    if rec.outcome in UNDECIDED_OUTCOMES:
        pytest.skip(f"{rec.outcome}: {rec.reason}")
    assert rec.outcome in PASSING_OUTCOMES, (
        f"{rec.outcome} (expected {rec.expected}) at {rec.failed_stage or '-'}: "
        f"{rec.exception_type or ''} {rec.message or rec.reason or ''}"[:3000]
    )
