"""The only CPU-tier shims, applied only when a stage runs on the cpu tier (no CUDA).

megatron-core 0.19.2's torch_dist save path calls ``torch.cuda.synchronize()`` and passes
``torch.cuda.current_device()`` as a ``device=`` argument (save path, global memory buffer of the
local attention); on a machine without CUDA both raise. Here synchronize becomes a no-op and the
current device is ``"cpu"``, so the REAL code runs over gloo on CPU. Megatron's CUDA RNG tracker
cannot seed on CPU; its ``fork`` becomes a plain context (the model has dropout 0, so nothing
inside a fork draws random numbers). megatron-core 0.15.x only (version-gated, ``mcore_0_15_shim``):
its moe_utils.py:13-28 imports ``te_general_gemm`` inside ``try`` and never defines it when TE is
absent, so the router GEMM (moe_utils.py:958) raises NameError; the shim gives it the value
megatron's own TE-less branch gives (extensions/transformer_engine.py:2085: None), so the
router takes its torch path, as on 0.16+. Nothing else is faked: model,
quantization, sharding metadata, validation and file I/O are the real components.
"""
from __future__ import annotations

import contextlib

import torch

_applied = False


def apply_cpu_shims() -> None:
    global _applied
    if _applied or torch.cuda.is_available():
        return
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    mcore_0_15_shim()
    _applied = True


def mcore_0_15_shim() -> bool:
    """Define moe_utils.te_general_gemm = None where megatron-core forgot to (0.15.x without TE);
    True when it was applied. A no-op on any other megatron-core or with TE."""
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm") or getattr(moe_utils, "HAVE_TE", True):
        return False
    moe_utils.te_general_gemm = None
    moe_utils._harness_shimmed = True  # results say so (harness/rank/setup.py environment)
    return True
