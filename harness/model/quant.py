"""ModelOpt quantization with a scenario's recipe (real calibration), the amax kinds it made,
and forwards with the quantizers bypassed."""
from __future__ import annotations

import contextlib

from harness.model.gpt import ModelSize, forward, sample_batch
from harness.model.recipes import (DEFAULT_RECIPE, NO_AMAX, PER_BLOCK, PER_CHANNEL, SCALAR,
                                   STATIC_BLOCK, Recipe, module_family, quant_config)
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


class NotQuantizable(RuntimeError):
    """ModelOpt refused to quantize the model with the recipe: an exception raised from ModelOpt's
    own code inside ``mtq.quantize``, named in the message as ``<type>: <text>`` (e.g. AWQ on TE
    grouped experts: "AttributeError: 'QuantTEColumnParallelGroupedLinear' object has no
    attribute 'weight'"). Judged ``not-quantizable`` (harness/check/judge.py)."""


def quantize(model, size: ModelSize, device, recipe: str = DEFAULT_RECIPE) -> None:
    """``mtq.quantize`` with the recipe's config (harness/model/recipes.py), calibrated by the
    recipe's own algorithm on a few seeded batches; ModelOpt's own refusal raises NotQuantizable."""
    import modelopt.torch.quantization as mtq

    from harness.paths import REPO_ROOT

    def forward_loop(m):
        for i in range(CALIBRATION_BATCHES):
            forward(m, sample_batch(size, CALIBRATION_SEED + i, device))

    config = quant_config(Recipe.parse(recipe), REPO_ROOT)
    try:
        mtq.quantize(model, config, forward_loop)
    except Exception as exc:
        if not raised_in_modelopt(exc):
            raise  # the harness's model or megatron-core: not ModelOpt's answer about the recipe
        raise NotQuantizable(f"{type(exc).__name__}: {exc}") from exc


def raised_in_modelopt(exc: BaseException) -> bool:
    """Whether the exception's innermost frame outside torch's own package is ModelOpt's code:
    ModelOpt's own raise, or a torch call ModelOpt made that refused it (AWQ on TE grouped experts
    asks ``module.weight``, which ``torch.nn.Module.__getattr__`` refuses: GPU run
    docs/runs/20261206-2335-device-session.md). A frame of the harness or megatron-core in
    between means the failure is theirs, not ModelOpt's answer about the recipe."""
    import os
    import traceback

    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(torch_dir)]
    return bool(frames) and "/modelopt/" in frames[-1].filename.replace("\\", "/")


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
    """What a calibrated weight quantizer holds: its amax read, named by its configuration where
    the amax alone does not say (a per-block or per-channel amax)."""
    amax = getattr(q, "_amax", None)
    if getattr(q, "_global_amax", None) is not None or getattr(q, "is_nvfp4_static", False):
        return STATIC_BLOCK
    if amax is None:
        return NO_AMAX
    if amax.numel() == 1:
        return SCALAR
    kind = configured_kind(q)
    return kind if kind in (PER_BLOCK, PER_CHANNEL) else f"shaped{tuple(amax.shape)}"


def configured_kind(q) -> str:
    """The amax kind a weight quantizer's configuration makes, by ModelOpt's own predicates:
    static NVFP4 blocks a per-block ``_amax`` and a ``_global_amax``; other static blocks a
    per-block ``_amax``; MX blocks none (e8m0 scales computed at run time); dynamic NVFP4 blocks
    and per-tensor formats one scalar amax; a per-channel axis one amax per channel."""
    if q.is_nvfp4_static:
        return STATIC_BLOCK
    if q.is_static_block_quant:
        return PER_BLOCK
    if q.is_mx_format:
        return NO_AMAX
    if q.block_sizes or q.axis is None:
        return SCALAR
    return PER_CHANNEL


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
