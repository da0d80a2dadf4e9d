"""The fix's parts, the versions and parts it applies only when asked for, and its refusals:
the names every module of the fix shares (they import this module, not the package, so the
package's ``apply()`` importing them is no circle). ``moe_ckpt_fix`` re-exports them."""
from __future__ import annotations

import os

from moe_ckpt_fix.releases import FIRST_FIXED

# The names ``applied_parts()`` gives what it installed by: parts (a)-(e) (0.47.0 only) and (f).
EXPERT_AMAX_PART, STATIC_BLOCK_PART = "expert-amax", "static-block"
UNLOADED_AMAX_PART = "unloaded-amax"
PARTS = {
    EXPERT_AMAX_PART: "parts (a)-(e), per-expert amax across TP != ETP and through load_state_dict",
    STATIC_BLOCK_PART: "part (f), static NVFP4 expert block amax across expert TP",
    UNLOADED_AMAX_PART: "part (g), the grouped post-restore's dry run on expert amax not yet "
                        "loaded (integer recipes' device-side assert)",
}
# Releases that have parts (a)-(e) themselves: ``apply()`` installs only these parts there.
PARTS_ONLY_VERSIONS = {FIRST_FIXED: (STATIC_BLOCK_PART, UNLOADED_AMAX_PART)}
# A part or version with no GPU record yet is applied only when asked for by name
# (``apply(allow_unproven=True)``, or UNPROVEN_VAR naming it), else refused or left out; it
# moves to the proven ones when a GPU record of its cells exists (docs/fix.md). None at present:
# part (f) and 0.48.0rc1 moved on 2026-12-06 (docs/runs/20261206-2027-device-session.md), part (g)
# the same night (wheel 0.4.0).
UNPROVEN_MODELOPT_VERSIONS: dict[str, str] = {}
UNPROVEN_PARTS: dict[str, str] = {}  # part (g) moved on 2026-12-06 (docs/runs/20261206-2335-device-session.md)
UNPROVEN_VAR = "MOE_CKPT_FIX_UNPROVEN"  # version or part names, commas between


def asked_words(environ=os.environ) -> list[str]:
    """What UNPROVEN_VAR names, in order: versions and parts of UNPROVEN_PARTS."""
    return [w.strip() for w in environ.get(UNPROVEN_VAR, "").split(",") if w.strip()]


def wanted(part: str, unproven: tuple[str, ...]) -> bool:
    """Whether a patcher installs ``part``: proven, or unproven and asked for (``unproven``)."""
    return part not in UNPROVEN_PARTS or part in unproven


def asked_for(word: str) -> bool:
    """Whether UNPROVEN_VAR names ``word`` (a version or a part of UNPROVEN_PARTS)."""
    return word in asked_words()




class Refused(RuntimeError):
    """``apply()`` would not patch this environment; the autoload route turns it into one line."""


class UnsupportedModeloptVersion(Refused):
    """The installed nvidia-modelopt is not the one this fix was written and checked against."""


class TransformerEngineMissing(Refused):
    """ModelOpt's Transformer Engine plugin classes (TEGroupedMLP support) are not defined."""
