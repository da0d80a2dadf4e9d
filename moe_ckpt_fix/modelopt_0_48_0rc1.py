"""The fix for nvidia-modelopt 0.48.0rc1: part (f), and part (g) (moe_ckpt_fix/unloaded_amax.py).

0.48.0rc1 has parts a-e of the 0.47.0 fix itself (per-expert amax on the expert TP/DP groups,
GroupedQuantizer members kept through ``modelopt_post_restore``; harness/check/versions.py of the
moe-ckpt-harness repository cites the lines), but not (f): its ``_QuantMegatronTEGroupedLinear``,
``_MegatronTEGroupedMLP``, ``_check_nvfp4_static_tp_supported`` (plugins/megatron.py) and
``max_calibrate`` (model_calib.py) are 0.47.0's where (f) reads them, so (f) is the same code
(moe_ckpt_fix/static_block.py). Proven on a GPU with the Ultra and Super recipes' reshard grids
(docs/fix.md).
"""
from __future__ import annotations

from moe_ckpt_fix import static_block, unloaded_amax
from moe_ckpt_fix.parts import STATIC_BLOCK_PART, UNLOADED_AMAX_PART, TransformerEngineMissing, wanted

_applied: str | None = None
_parts: tuple[str, ...] = ()


def parts() -> tuple[str, ...]:
    """The parts installed in this process (moe_ckpt_fix.applied_parts): (f), and (g)."""
    return _parts


def apply(unproven: tuple[str, ...] = ()) -> str:
    """Install (f) on 0.48.0rc1, and (g) (asked for by ``unproven`` while it is in UNPROVEN_PARTS). Called through
    ``moe_ckpt_fix.apply()`` after the version check."""
    global _applied, _parts
    if _applied is not None:
        return _applied
    try:  # 0.48.0rc1 imports Transformer Engine unconditionally in its megatron plugin
        import modelopt.torch.quantization.plugins.megatron as mp
    except ImportError as exc:
        raise TransformerEngineMissing(
            f"moe_ckpt_fix: modelopt's megatron plugin does not import ({exc}); 0.48.0rc1 needs "
            "Transformer Engine for it. Nothing was patched.") from exc
    if not hasattr(mp, "_QuantMegatronTEGroupedLinear") or not hasattr(mp, "_MegatronTEGroupedMLP"):
        raise TransformerEngineMissing(
            "moe_ckpt_fix: modelopt's Transformer Engine plugin classes (_QuantMegatronTEGroupedLinear, "
            "_MegatronTEGroupedMLP) are not defined here. Nothing was patched.")
    install = static_block.prepare(mp)
    install_unloaded = unloaded_amax.prepare(mp)
    described = [install()]
    _parts = (STATIC_BLOCK_PART,)
    if wanted(UNLOADED_AMAX_PART, unproven):
        described.append(install_unloaded())
        _parts += (UNLOADED_AMAX_PART,)
    _applied = ("nvidia-modelopt 0.48.0rc1 patched (moe_ckpt_fix, the release has (a)-(e) "
                "itself): " + "; ".join(described))
    return _applied
