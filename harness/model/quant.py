"""ModelOpt NVFP4 quantization (real calibration), and forwards with the quantizers bypassed."""
from __future__ import annotations

import contextlib

from harness.model.gpt import ModelSize, forward, sample_batch

CALIBRATION_BATCHES = 3
CALIBRATION_SEED = 100


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
