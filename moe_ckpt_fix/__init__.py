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

from moe_ckpt_fix.parts import (EXPERT_AMAX_PART, PARTS, PARTS_ONLY_VERSIONS, STATIC_BLOCK_PART,  # noqa: F401
                                UNLOADED_AMAX_PART, UNPROVEN_MODELOPT_VERSIONS, UNPROVEN_PARTS,
                                UNPROVEN_VAR, Refused, TransformerEngineMissing,
                                UnsupportedModeloptVersion, asked_for, asked_words, wanted)
from moe_ckpt_fix.releases import SUPPORTED_MCORE_VERSIONS, SUPPORTED_MODELOPT_VERSION  # noqa: F401

__version__ = "0.4.0"  # the wheel's version (tools/fix-wheel/pyproject.toml reads it)
DISTRIBUTION = "moe-ckpt-fix"
WHEEL = f"moe_ckpt_fix-{__version__}-py3-none-any.whl"  # what `make fix-wheel` writes into dist/
BUILT_WHEEL = f"dist/{WHEEL}"  # where `make fix-wheel` leaves it, from the repository root
# The whole change to a job's pipeline (README "Using the fix"; the gate's next step names it).
JOB_CHANGE = f"pip install --no-deps {BUILT_WHEEL} and MOE_CKPT_FIX=1 in the job's environment"


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
        from moe_ckpt_fix import modelopt_0_47_0 as patcher
    else:
        from moe_ckpt_fix import modelopt_0_48_0rc1 as patcher
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
