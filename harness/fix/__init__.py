"""Runtime fix for the per-expert MoE quantizer checkpoint bugs of nvidia-modelopt 0.47.0.

Until an upstream release carries the fix (NVIDIA/Model-Optimizer issue #2209), users apply it in
their own Megatron-LM / ModelOpt runs, either in code::

    import harness.fix; harness.fix.apply()      # before building/loading the model

or, without touching their code, through the environment::

    MOE_CKPT_FIX=1 PYTHONPATH=<repo>/harness/fix/autoload:$PYTHONPATH torchrun ...

(see ``autoload/sitecustomize.py``: ``MOE_CKPT_FIX`` takes ``1``/``true``/``yes`` or
``0``/``false``/``no``/empty; any other value, or a refusal below, stops the process with one
line on stderr). The same change, as a diff against the 0.47.0 sources, is
``patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff``.

The fix is tied to one exact modelopt version because it wraps private methods whose bodies it
relies on; any other version is refused rather than patched blindly.
"""
from __future__ import annotations

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
            f"harness.fix supports nvidia-modelopt=={SUPPORTED_MODELOPT_VERSION} only, but "
            f"{'nvidia-modelopt is not installed' if installed is None else f'{installed} is installed'}. "
            "Nothing was patched. If the installed version already contains the upstream fix "
            "(NVIDIA/Model-Optimizer #2209), do not apply this one; otherwise port "
            "patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff to it."
        )
    mcore = _installed_mcore_version()
    if (mcore or "").split("+")[0] not in SUPPORTED_MCORE_VERSIONS:
        raise UnsupportedModeloptVersion(
            f"harness.fix applies to nvidia-modelopt 0.47.0 with megatron-core "
            f"{' or '.join(SUPPORTED_MCORE_VERSIONS)} only, but megatron-core {mcore} is installed; "
            "nothing was patched (megatron-core < 0.16 already gives expert amax the expert-TP "
            "rank, and collides on the shared input_quantizer amax instead, which this fix does "
            "not touch: harness/check/versions.py)")
    from . import modelopt_0_47_0

    return modelopt_0_47_0.apply()


def _installed_mcore_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


__all__ = [
    "SUPPORTED_MODELOPT_VERSION",
    "Refused",
    "TransformerEngineMissing",
    "UnsupportedModeloptVersion",
    "apply",
]
