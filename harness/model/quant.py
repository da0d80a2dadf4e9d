"""ModelOpt quantization with a scenario's recipe (real calibration), the amax kinds it made,
and forwards with the quantizers bypassed."""
from __future__ import annotations

import contextlib

from harness.model.gpt import ModelSize, forward, sample_batch
from harness.model.recipes import (DEFAULT_RECIPE, SCALAR, STATIC_BLOCK, Recipe, module_family,
                                   quant_config)
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


def quantize(model, size: ModelSize, device, recipe: str = DEFAULT_RECIPE) -> None:
    """``mtq.quantize`` with the recipe's config (harness/model/recipes.py), calibrated by the
    recipe's own algorithm on a few seeded batches."""
    import modelopt.torch.quantization as mtq

    from harness.paths import REPO_ROOT

    def forward_loop(m):
        for i in range(CALIBRATION_BATCHES):
            forward(m, sample_batch(size, CALIBRATION_SEED + i, device))

    mtq.quantize(model, quant_config(Recipe.parse(recipe), REPO_ROOT), forward_loop)


def amax_kinds(model) -> dict[str, list[str]]:
    """What the calibration made, per module family (``experts``, ``shared_experts``, ``other``):
    the kinds of amax its enabled weight quantizers hold (harness/check/recipes.py words).

    Recorded by the save stage so the recipe catalogue is checked against what really ran."""
    found: dict[str, set[str]] = {}
    for name, q in tensor_quantizers(model):
        if "weight_quantizer" not in name or not q.is_enabled:
            continue
        found.setdefault(module_family(name), set()).add(_kind(q))
    return {k: sorted(v) for k, v in sorted(found.items())}


def _kind(q) -> str:
    amax = getattr(q, "_amax", None)
    if getattr(q, "_global_amax", None) is not None or getattr(q, "is_nvfp4_static", False):
        return STATIC_BLOCK
    if amax is None:
        return "no-amax"
    return SCALAR if amax.numel() == 1 else f"shaped{tuple(amax.shape)}"


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
