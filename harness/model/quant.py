"""ModelOpt NVFP4 quantization (real calibration), and forwards with the quantizers bypassed."""
from __future__ import annotations

import contextlib

from harness.model.gpt import ModelSize, forward, sample_batch
from harness.tiers import Backend
from harness.topology.topology import Topology

CALIBRATION_BATCHES = 3
CALIBRATION_SEED = 100


def topology_problems(topo: Topology, backend: str) -> list[str]:
    """What ModelOpt refuses of this topology on this backend, one line each, so the controller
    refuses it before any rank starts (``mtq.quantize`` would raise on every rank)."""
    # modelopt/torch/quantization/plugins/megatron.py:736-741 (0.47.0) ValueError in
    # _MegatronSequentialMLP._setup: the local backend's SequentialMLP experts.
    if backend == Backend.LOCAL and topo.tp > 1 and topo.ep > 1:
        return [f"tp {topo.tp} with ep {topo.ep}: ModelOpt's QuantSequentialMLP (backend local) "
                "refuses TP > 1 with EP > 1; set tp or ep to 1"]
    return []


def quantize_nvfp4(model, size: ModelSize, device) -> None:
    """``mtq.quantize`` with ``NVFP4_DEFAULT_CFG``, max-calibrated on a few seeded batches."""
    import modelopt.torch.quantization as mtq

    def forward_loop(m):
        for i in range(CALIBRATION_BATCHES):
            forward(m, sample_batch(size, CALIBRATION_SEED + i, device))

    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, forward_loop)


def tensor_quantizers(model):
    from modelopt.torch.quantization.nn import TensorQuantizer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, TensorQuantizer)]


@contextlib.contextmanager
def quantizers_bypassed(model):
    """Run a forward pass without fake quantization, restoring each quantizer's state after.

    Used on the cpu tier only: ModelOpt's NVFP4 fake-quant kernel asserts CUDA tensors.
    """
    enabled = [q for _, q in tensor_quantizers(model) if q.is_enabled]
    for q in enabled:
        q.disable()
    try:
        yield
    finally:
        for q in enabled:
            q.enable()
