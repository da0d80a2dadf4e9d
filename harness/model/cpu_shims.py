"""The only CPU-tier shims, applied only when a stage runs on the cpu tier (no CUDA).

megatron-core 0.19.2's torch_dist save path calls ``torch.cuda.synchronize()`` and passes
``torch.cuda.current_device()`` as a ``device=`` argument (save path, global memory buffer of the
local attention), and the MTP stage's embedding goes through ``Tensor.cuda()`` at pp > 1; on a
machine without CUDA all raise. Here synchronize becomes a no-op, the current device is ``"cpu"``
and ``Tensor.cuda()`` leaves a tensor on the CPU, so the REAL code runs over gloo on CPU. Megatron's CUDA RNG tracker
cannot seed on CPU; its ``fork`` becomes a plain context (the model has dropout 0, so nothing
inside a fork draws random numbers). On megatron-core 0.15.x only, the router's missing
``te_general_gemm`` is defined (harness/model/mcore_shims.py, version-gated). Nothing else is faked: model,
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
    # megatron-core 0.19.2 copies the MTP stage's word embedding to CUDA before all-reducing it
    # with the first stage's (models/common/language_module/language_module.py:304-308): on the
    # cpu tier it stays where it is, and the all-reduce runs over gloo as any other.
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[assignment]
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    from harness.model.mcore_shims import shim_te_general_gemm

    shim_te_general_gemm()
    _applied = True
