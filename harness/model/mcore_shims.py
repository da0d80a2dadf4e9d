"""Version-gated shims for older megatron-core releases (0.15.x, and one for 0.16.x).

Each one repairs a name a megatron-core release uses but never defines, gives it the value later
releases give, and does nothing on any other megatron-core (the name is already there). Which
ones a stage ran with goes into its environment record (``shims``), so results say so.

- ``model_parallel_config.warnings``: 0.15.3 model_parallel_config.py:388-393 calls
  ``warnings.warn`` (EP > 1 and TP > 1 without sequence parallelism) but never imports
  ``warnings`` (its imports, :3-6), so building any TransformerConfig at EP > 1, TP > 1 raises
  NameError; 0.16.1 imports it (:3). Seen on the cpu tier for tp4-etp1-ep8 and tp2-etp1-ep2.
- ``moe_utils.te_general_gemm``: 0.15.3 moe_utils.py:13-28 imports it inside ``try`` and never
  defines it when Transformer Engine is absent, so the router GEMM (:958) raises NameError; the
  TE-less value megatron-core itself uses is None (extensions/transformer_engine.py:2085). 0.16.1
  has the same gap (moe_utils.py:25-39, used at :1192); 0.19.2 defines it. Only matters without
  TE (the cpu tier).
"""
from __future__ import annotations

_APPLIED: list[str] = []


def shim_config_warnings() -> bool:
    import warnings

    from megatron.core import model_parallel_config as mpc

    if "warnings" in vars(mpc):
        return False
    mpc.warnings = warnings
    _APPLIED.append("mcore-0.15-model_parallel_config-warnings")
    return True


def shim_te_general_gemm() -> bool:
    from megatron.core.transformer.moe import moe_utils

    if "te_general_gemm" in vars(moe_utils) or getattr(moe_utils, "HAVE_TE", True):
        return False
    moe_utils.te_general_gemm = None
    _APPLIED.append("mcore-te_general_gemm")
    return True


def applied() -> list[str]:
    """The shims this process applied, in order."""
    return list(dict.fromkeys(_APPLIED))
