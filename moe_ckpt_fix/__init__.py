"""Runtime fix for the per-expert MoE quantizer checkpoint bugs of nvidia-modelopt 0.47.0.

Until an upstream release carries the fix (NVIDIA/Model-Optimizer issue #2209), users apply it in
their own Megatron-LM / ModelOpt runs. A job installs this package's wheel (distribution
``moe-ckpt-fix``, built by ``make fix-wheel`` in the moe-ckpt-harness repository) and sets
``MOE_CKPT_FIX=1`` in its environment: the wheel's ``moe_ckpt_fix.pth`` runs ``autoload`` at
interpreter start-up, which applies the fix once ``modelopt.torch`` is imported (``MOE_CKPT_FIX``
takes ``1``/``true``/``yes`` or ``0``/``false``/``no``/empty; any other value, or a refusal
below, stops the process with one line on stderr). In code::

    import moe_ckpt_fix; moe_ckpt_fix.apply()    # before building/loading the model

The harness imports this package as ``harness.fix`` (the same module object). The same change,
as diffs against the 0.47.0 sources, is ``patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff``
(parts a-c) and ``patches/nvidia-modelopt-0.47.0-static-block-expert-tp.diff`` (part f) in that
repository.

The fix is tied to exact modelopt versions because it wraps private methods whose bodies it
relies on; any other version is refused rather than patched blindly. 0.47.0 gets every part
(a-g); 0.48.0rc1 (which fixed a-e itself) gets parts (f), static NVFP4 experts across expert TP,
and (g), the grouped post-restore's dry run on expert amax not yet loaded. All are proven on a
GPU (docs/fix.md names the runs). This package imports neither torch nor
modelopt until ``apply()`` runs, and nothing of the harness ever.
"""
from __future__ import annotations

import os

__version__ = "0.4.0"  # the wheel's version (tools/fix-wheel/pyproject.toml reads it)
DISTRIBUTION = "moe-ckpt-fix"
WHEEL = f"moe_ckpt_fix-{__version__}-py3-none-any.whl"  # what `make fix-wheel` writes into dist/
BUILT_WHEEL = f"dist/{WHEEL}"  # where `make fix-wheel` leaves it, from the repository root
# The whole change to a job's pipeline (README "Using the fix"; the gate's next step names it).
JOB_CHANGE = f"pip install --no-deps {BUILT_WHEEL} and MOE_CKPT_FIX=1 in the job's environment"

SUPPORTED_MODELOPT_VERSION = "0.47.0"  # every part, proven on a GPU
# The names ``applied_parts()`` gives what it installed by: parts (a)-(e) (0.47.0 only) and (f).
EXPERT_AMAX_PART, STATIC_BLOCK_PART = "expert-amax", "static-block"
UNLOADED_AMAX_PART = "unloaded-amax"
PARTS = {
    EXPERT_AMAX_PART: "parts (a)-(e), per-expert amax across TP != ETP and through load_state_dict",
    STATIC_BLOCK_PART: "part (f), static NVFP4 expert block amax across expert TP (issue 54)",
    UNLOADED_AMAX_PART: "part (g), the grouped post-restore's dry run on expert amax not yet "
                        "loaded (integer recipes' device-side assert; issue 52)",
}
# Releases that have parts (a)-(e) themselves: ``apply()`` installs only these parts there.
PARTS_ONLY_VERSIONS = {"0.48.0rc1": (STATIC_BLOCK_PART, UNLOADED_AMAX_PART)}
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


# Where its premise holds (per-expert amax take the DENSE TP rank: megatron-core >= 0.16, no
# expert_dist_ckpt_decorator); 0.19.2 is checked on the GPU, 0.16.x by the same source lines.
SUPPORTED_MCORE_VERSIONS = ("0.16.0", "0.16.1", "0.19.2")


class Refused(RuntimeError):
    """``apply()`` would not patch this environment; the autoload route turns it into one line."""


class UnsupportedModeloptVersion(Refused):
    """The installed nvidia-modelopt is not the one this fix was written and checked against."""


class TransformerEngineMissing(Refused):
    """ModelOpt's Transformer Engine plugin classes (TEGroupedMLP support) are not defined."""


def _installed_modelopt_version() -> str | None:
    """The nvidia-modelopt distribution version, or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-modelopt")
    except metadata.PackageNotFoundError:
        return None


def apply(allow_unproven: bool = False) -> str:
    """Patch the installed nvidia-modelopt in this process; idempotent.

    Returns a short description of what is patched. Raises ``UnsupportedModeloptVersion`` on any
    nvidia-modelopt but 0.47.0 (every part), a ``PARTS_ONLY_VERSIONS`` release (its parts), or one
    of ``UNPROVEN_MODELOPT_VERSIONS`` asked for by name (``allow_unproven``, or
    ``MOE_CKPT_FIX_UNPROVEN=<version>``), and ``TransformerEngineMissing``
    when Transformer Engine is not importable (the TEGroupedMLP plugin classes then do not exist,
    and neither does the bug).
    """
    global _applied_version, _applied_parts
    installed = _installed_modelopt_version()
    asked = allow_unproven or asked_for(installed or "")
    if (installed != SUPPORTED_MODELOPT_VERSION and installed not in PARTS_ONLY_VERSIONS
            and not (installed in UNPROVEN_MODELOPT_VERSIONS and asked)):
        unproven = UNPROVEN_MODELOPT_VERSIONS.get(installed)
        raise UnsupportedModeloptVersion(
            f"moe_ckpt_fix supports nvidia-modelopt=={SUPPORTED_MODELOPT_VERSION} (and part (f) on "
            f"{', '.join(PARTS_ONLY_VERSIONS)}) only, but "
            f"{'nvidia-modelopt is not installed' if installed is None else f'{installed} is installed'}. "
            "Nothing was patched. "
            + (f"For {installed} this package has {unproven}: set {UNPROVEN_VAR}={installed} "
               "(or call apply(allow_unproven=True)) to apply it anyway."
               if unproven else
               "If the installed version already contains the upstream fix "
               "(NVIDIA/Model-Optimizer #2209), do not apply this one; otherwise port "
               "patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff of the moe-ckpt-harness "
               "repository to it.")
        )
    mcore = _installed_mcore_version()
    if (mcore or "").split("+")[0] not in SUPPORTED_MCORE_VERSIONS:
        raise UnsupportedModeloptVersion(
            f"moe_ckpt_fix applies to nvidia-modelopt {installed} with megatron-core "
            f"{' or '.join(SUPPORTED_MCORE_VERSIONS)} only, but megatron-core {mcore} is installed; "
            "nothing was patched (megatron-core < 0.16 already gives expert amax the expert-TP "
            "rank, and collides on the shared input_quantizer amax instead, which this fix does "
            "not touch: harness/check/versions.py of the moe-ckpt-harness repository)")
    if installed == SUPPORTED_MODELOPT_VERSION:
        from . import modelopt_0_47_0 as patcher
    else:
        from . import modelopt_0_48_0rc1 as patcher
    description = patcher.apply(
        unproven=tuple(p for p in UNPROVEN_PARTS if allow_unproven or asked_for(p)))
    _applied_version, _applied_parts = __version__, patcher.parts()
    return description


def applied() -> str | None:
    """This package's version once ``apply()`` has patched this process, else None (what a
    record of the run names as the fix that ran)."""
    return _applied_version


def applied_parts() -> tuple[str, ...]:
    """The parts ``apply()`` installed in this process, by name (EXPERT_AMAX_PART,
    STATIC_BLOCK_PART), () before it has: what a record of the run names, since the parts
    differ per release (and per wheel version) and a judge must not assume them."""
    return _applied_parts


_applied_version: str | None = None
_applied_parts: tuple[str, ...] = ()


def _installed_mcore_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


__all__ = [
    "DISTRIBUTION",
    "JOB_CHANGE",
    "SUPPORTED_MCORE_VERSIONS",
    "SUPPORTED_MODELOPT_VERSION",
    "PARTS",
    "PARTS_ONLY_VERSIONS",
    "UNPROVEN_MODELOPT_VERSIONS",
    "UNPROVEN_PARTS",
    "asked_for",
    "asked_words",
    "UNPROVEN_VAR",
    "WHEEL",
    "Refused",
    "TransformerEngineMissing",
    "UnsupportedModeloptVersion",
    "__version__",
    "EXPERT_AMAX_PART",
    "STATIC_BLOCK_PART",
    "applied",
    "applied_parts",
    "apply",
]
