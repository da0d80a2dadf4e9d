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
as a diff against the 0.47.0 sources, is ``patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff``
in that repository.

The fix is tied to one exact modelopt version because it wraps private methods whose bodies it
relies on; any other version is refused rather than patched blindly. This package imports
neither torch nor modelopt until ``apply()`` runs, and nothing of the harness ever.
"""
from __future__ import annotations

__version__ = "0.1.0"  # the wheel's version (tools/fix-wheel/pyproject.toml reads it)
DISTRIBUTION = "moe-ckpt-fix"
WHEEL = f"moe_ckpt_fix-{__version__}-py3-none-any.whl"  # what `make fix-wheel` writes into dist/
# The whole change to a job's pipeline (README "Using the fix"; the gate's next step names it).
JOB_CHANGE = f"pip install --no-deps {WHEEL} and MOE_CKPT_FIX=1 in the job's environment"

SUPPORTED_MODELOPT_VERSION = "0.47.0"
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


def apply() -> str:
    """Patch the installed nvidia-modelopt in this process; idempotent.

    Returns a short description of what is patched. Raises ``UnsupportedModeloptVersion`` on any
    nvidia-modelopt other than 0.47.0 and ``TransformerEngineMissing`` when Transformer Engine is
    not importable (the TEGroupedMLP plugin classes then do not exist, and neither does the bug).
    """
    installed = _installed_modelopt_version()
    if installed != SUPPORTED_MODELOPT_VERSION:
        raise UnsupportedModeloptVersion(
            f"moe_ckpt_fix supports nvidia-modelopt=={SUPPORTED_MODELOPT_VERSION} only, but "
            f"{'nvidia-modelopt is not installed' if installed is None else f'{installed} is installed'}. "
            "Nothing was patched. If the installed version already contains the upstream fix "
            "(NVIDIA/Model-Optimizer #2209), do not apply this one; otherwise port "
            "patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff of the moe-ckpt-harness "
            "repository to it."
        )
    mcore = _installed_mcore_version()
    if (mcore or "").split("+")[0] not in SUPPORTED_MCORE_VERSIONS:
        raise UnsupportedModeloptVersion(
            f"moe_ckpt_fix applies to nvidia-modelopt 0.47.0 with megatron-core "
            f"{' or '.join(SUPPORTED_MCORE_VERSIONS)} only, but megatron-core {mcore} is installed; "
            "nothing was patched (megatron-core < 0.16 already gives expert amax the expert-TP "
            "rank, and collides on the shared input_quantizer amax instead, which this fix does "
            "not touch: harness/check/versions.py of the moe-ckpt-harness repository)")
    from . import modelopt_0_47_0

    return modelopt_0_47_0.apply()


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
    "WHEEL",
    "Refused",
    "TransformerEngineMissing",
    "UnsupportedModeloptVersion",
    "__version__",
    "apply",
]
