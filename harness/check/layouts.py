"""The words for checkpoint layouts: what a checkpoint holds, what a golden's rule is keyed by,
and what a release does with it.

Why: a checkpoint is classified once (harness/golden/layout.py), a release's rule is keyed by
the result (harness/check/versions.py ``golden_restore``), and scenarios, forecasts, repairs and
synthetic checkpoints all speak of the same layouts: one spelling, here.
"""
from __future__ import annotations

from enum import StrEnum

from harness.records import Expected


class CkptLayout(StrEnum):
    """The grouped-MLP weight-quantizer layout a checkpoint (or a release) holds."""

    PER_EXPERT = "per-expert"  # ModelOpt >= 0.47.0: one weight-quantizer amax per expert
    SHARED = "shared"  # ModelOpt <= 0.46.x: one per grouped linear
    MIXED = "mixed"  # both (should not happen; reported rather than guessed)
    INCOMPLETE = "incomplete"  # experts quantized, no expert weight-quantizer amax at all
    UNQUANTIZED = "unquantized"  # no expert weight-quantizer state


class GoldenLayout(StrEnum):
    """What a release's ``golden_restore`` rule is keyed by."""

    SHARED = "shared"
    COMPLETE = "complete"  # per-expert, every expert's amax present
    INCOMPLETE = "incomplete"  # per-expert with experts missing, or none written


class Restore(StrEnum):
    """What an unpatched load of a golden of one layout gives under a release."""

    RESTORED = "restored"
    NOT_RESTORED = Expected.NOT_RESTORED.value  # the cell expects it so


def golden_layout_of(lay) -> GoldenLayout | None:
    """The ``golden_restore`` key of a classified checkpoint (harness/golden/layout.py Layout);
    None for an unquantized or mixed one (no rule)."""
    if lay.kind == CkptLayout.SHARED:
        return GoldenLayout.SHARED
    if lay.kind == CkptLayout.PER_EXPERT:
        return GoldenLayout.INCOMPLETE if lay.missing else GoldenLayout.COMPLETE
    if lay.kind == CkptLayout.INCOMPLETE:
        return GoldenLayout.INCOMPLETE
    return None
