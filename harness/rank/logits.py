"""Measured on the rank: eval-mode logits of a seeded batch, gathered over tensor parallelism.

This module measures; harness/check/logits.py judges the figures (in the controller).

Two forward passes per model: ``plain`` with every quantizer bypassed (the stored weights in
bf16/fp32) and, on GPUs, ``nvfp4`` with ModelOpt's fake quantization on. Only ``plain`` is
asserted: NVFP4 rounds activations to 8 levels per 16-value block, so the bf16 reduction-order
noise of a different TP/EP split flips whole quantization steps and the difference says nothing
about the checkpoint (measured on an H200: 0.19-0.43 relative max-abs between topologies with
every tensor and amax bit-exact, 0.0 at the same topology). The quantizer state itself is
compared bit for bit elsewhere; ``nvfp4`` figures are reported.

With pipeline parallelism the forward goes through megatron-core's schedule (model/gpt.py
``forward``); each stage records its own routers, keyed by global layer number, and the stages'
records are gathered over the pipeline group onto the rank that owns the logits.

Routing: the plain pass also records every MoE router's (token, expert) selection. Top-k routing
is discontinuous: a bf16-level change in router logits between TP/EP splits can send a token to
another expert, which moves that token's logits far more than rounding does. Tokens whose
expert choice differs anywhere are counted (``routing_flips``) and the deviation of the tokens
routed identically in every layer is reported separately (``logits_plain_same_routing``).

Determinism: every probe forward runs under ``torch.use_deterministic_algorithms``. Without it
megatron-core's MoE ``unpermute`` sums each token's top-k expert outputs with CUDA
``scatter_add_`` atomics in no fixed order (``index_add_`` when deterministic algorithms are on):
two addends (top-2) are exact in any order, six (Nano's top-6) are not, and over 23 MoE layers
the rounding reaches router near-ties. Measured on the H200 (docs/runs/20261203-065627-shape-nano):
the SAME model and state measured twice at tp4-etp1-ep8 (every tensor bit-exact, nothing
written between the passes) differed 0.063 and 0.080 relative.
Measured on the H200 (docs/runs/20261202-151428-routing): save tp1-etp1-ep8 -> load
tp4-etp1-ep8 with every tensor bit-exact on all 8 ranks had whole-batch plain logits 0.313 rel
off, from ONE of 32 tokens taking another expert; the other 31 tokens were 0.0065 off, like
every other cell. So the asserted figure is the identically routed tokens' deviation, and at
most ``MAX_FLIP_FRACTION`` (harness/check/logits.py) of the tokens may flip (router weights are compared bit for bit
elsewhere; many flips would mean the forward differs beyond rounding).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from harness.model.gpt import ModelSize, forward, sample_batch
from harness.model.quant import quantizers_bypassed
from harness.tiers import on_cuda

LOGITS_BATCH_SEED = 7  # the seeded batch every topology's logits are measured on


def _gather_tp(local: torch.Tensor) -> torch.Tensor | None:
    from megatron.core import parallel_state as ps

    parts = [torch.empty_like(local) for _ in range(ps.get_tensor_model_parallel_world_size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    owner = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    return torch.cat(parts, dim=-1).float().cpu() if owner else None


def _gather_logits(local: torch.Tensor | None) -> torch.Tensor | None:
    """Full logits on their owner: tp 0, dp 0 of the last pipeline stage (the only stage with
    logits; the others return None without a collective)."""
    return None if local is None else _gather_tp(local)


def _record_routing(model) -> tuple[dict, list]:
    """Forward hooks on every router: ``layer<global layer number>`` (an MTP layer's router: its
    module path, harness/model/modules.py ``router_key``) -> boolean [tokens, experts] selection
    map (the key names the same router on every pipeline split)."""
    from megatron.core.transformer.moe.router import Router

    from harness.model.modules import router_key

    maps, handles = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, Router):
            key = router_key(name, mod)
            def hook(_m, _inp, out, key=key):
                maps[key] = out[1].detach().bool().cpu()
            handles.append(mod.register_forward_hook(hook))
    return maps, handles


def _routing_of_all_stages(mine: dict) -> dict:
    """Every pipeline stage's router records, merged (each stage holds only its own layers)."""
    from megatron.core import parallel_state as ps

    parts = [None] * ps.get_pipeline_model_parallel_world_size()
    torch.distributed.all_gather_object(parts, mine, group=ps.get_pipeline_model_parallel_group())
    return {k: v for part in parts for k, v in part.items()}


@contextmanager
def deterministic_algorithms():
    """torch's deterministic algorithms on for the block (megatron-core then picks its
    deterministic MoE kernels; see the module docstring), the previous setting restored after.
    ``warn_only``: an op without a deterministic kernel warns instead of failing the stage."""
    was, warn_only = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


@deterministic_algorithms()  # every pass of the probe (module docstring, "Determinism")
def measure_logits(model, size: ModelSize, tier: str, device) -> dict[str, torch.Tensor] | None:
    """{"plain", "nvfp4", "routing"} on the rank that owns full logits (tp 0, dp 0), else None."""
    batch = sample_batch(size, LOGITS_BATCH_SEED, device)
    from megatron.core import parallel_state as ps

    routing, handles = _record_routing(model)
    try:
        with quantizers_bypassed(model):
            out = {"plain": _gather_logits(forward(model, batch))}
    finally:
        for h in handles:
            h.remove()
    if ps.get_pipeline_model_parallel_world_size() > 1:  # every rank takes part
        routing = _routing_of_all_stages(routing)
    out["routing"] = routing
    if on_cuda(tier):  # ModelOpt's NVFP4 fake-quant kernel asserts CUDA tensors
        out["nvfp4"] = _gather_logits(forward(model, batch))
    return out if out["plain"] is not None else None


@deterministic_algorithms()
def measure_plain_fp32(model, size: ModelSize, device) -> dict[str, torch.Tensor] | None:
    """{"plain", "routing"} of the same state in fp32 (the noise floor of harness/check/logits.py),
    on the rank that owns full logits. Converts the model to fp32 IN PLACE: a stage's last pass.
    The config's dtypes follow (pipeline sends and TE's checks read them)."""
    model.float()
    cfg = model.config
    cfg.bf16, cfg.params_dtype, cfg.pipeline_dtype = False, torch.float32, torch.float32
    batch = sample_batch(size, LOGITS_BATCH_SEED, device)
    from megatron.core import parallel_state as ps

    routing, handles = _record_routing(model)
    try:
        with quantizers_bypassed(model):
            plain = _gather_logits(forward(model, batch, bf16_autocast=False))
    finally:
        for h in handles:
            h.remove()
    if ps.get_pipeline_model_parallel_world_size() > 1:
        routing = _routing_of_all_stages(routing)
    return {"plain": plain, "routing": routing} if plain is not None else None


def fp32_pass(model, size: ModelSize, device) -> tuple[dict | None, str | None]:
    """``measure_plain_fp32``, or (None, the error in one line): a noise floor that cannot be
    measured is reported as such, it never fails the stage. Every rank runs the same code, so an
    error is raised on every rank alike."""
    try:
        return measure_plain_fp32(model, size, device), None
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel without an fp32 path
        return None, f"fp32 pass failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def noise_floor_figures(restored: dict, fp32_load: dict, ref: dict, fp32_save: dict) -> dict:
    """bf16 vs fp32 at each topology and fp32 across them, as max-abs over the scale of the
    checkpoint's bf16 logits at the save topology (the scale of ``logits_plain``'s rel_diff),
    so the figures add up against the cross-topology figure."""
    scale = max(ref["plain"].abs().max().item(), 1e-12)

    def rel(a, b):
        return (a - b).abs().max().item() / scale

    out = {"bf16_vs_fp32_save": rel(ref["plain"], fp32_save["plain"]),
           "bf16_vs_fp32_load": rel(restored["plain"], fp32_load["plain"]),
           "fp32_cross_topology": rel(fp32_load["plain"], fp32_save["plain"])}
    same = same_routing_tokens(fp32_load.get("routing"), fp32_save.get("routing"),
                               tuple(fp32_load["plain"].shape[:2]))
    if same is not None:
        out["fp32_routing_flips"] = int((~same).sum())
    return out


def save_logits(logits: dict, reference_dir: Path, which: str) -> None:
    """``which``: "saved_model" (before saving), "checkpoint" (reloaded at the save topology) or
    "checkpoint_fp32" (the same state in fp32, the noise floor's reference)."""
    torch.save(logits, reference_dir / f"logits_{which}.pt")


def _figures(got: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (got - ref).abs()
    return {
        "max_abs_diff": diff.max().item(),
        "rel_diff": diff.max().item() / max(ref.abs().max().item(), 1e-12),
        "rel_rms": (diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-12)).item(),
        "top1_agreement": (got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    }


def same_routing_tokens(got: dict, ref: dict, batch_shape: tuple[int, int]) -> torch.Tensor | None:
    """[batch, seq] mask of tokens every router sent to the same experts in both passes.

    Routers see hidden states as [seq, batch]: row ``s * batch + b`` is token (b, s).
    """
    if not got or not ref or set(got) != set(ref):
        return None
    b, s = batch_shape
    same = torch.ones(s * b, dtype=torch.bool)
    for name in ref:
        if got[name].shape != ref[name].shape or got[name].shape[0] != s * b:
            return None
        same &= (got[name] == ref[name]).all(-1)
    return same.reshape(s, b).t()


def _routing_figures(logits: dict, ref: dict) -> dict:
    plain, ref_plain = logits["plain"], ref["plain"]
    same = same_routing_tokens(logits.get("routing"), ref.get("routing"), tuple(plain.shape[:2]))
    if same is None:
        return {}
    out = {"routing_tokens": int(same.numel()), "routing_flips": int((~same).sum())}
    if same.any():
        out["logits_plain_same_routing"] = _figures(plain[same], ref_plain[same])
    return out


def logits_figures(logits: dict, reference_dir: Path) -> dict:
    """Against the checkpoint's logits at the save topology (asserted for ``plain``), and the
    plain logits of the model as it was before saving (reported)."""
    ref = torch.load(reference_dir / "logits_checkpoint.pt")
    saved = torch.load(reference_dir / "logits_saved_model.pt")
    out = {f"logits_{mode}": _figures(logits[mode], ref[mode])
           for mode in ("plain", "nvfp4") if mode in logits and mode in ref}
    out.update(_routing_figures(logits, ref))
    out["logits_plain_vs_saved_model_rel_diff"] = _figures(logits["plain"], saved["plain"])["rel_diff"]
    return out


def at_load_topology_figures(loaded: dict, restored: dict, tensors_written: int | None = None) -> dict:
    """The loaded model's logits against the same model with the saved state written into it
    (harness/check/logits.py LOGITS_REFERENCES, "load-topology"), with the routing flips between
    the two passes. ``tensors_written`` (over all ranks): 0 means the loaded state was already
    the saved state, so the two passes measure the forward's own repeatability."""
    out = {mode: _figures(loaded[mode], restored[mode])
           for mode in ("plain", "nvfp4") if mode in loaded and mode in restored}
    out.update(_routing_figures(loaded, restored))
    if tensors_written is not None:
        out["tensors_written"] = tensors_written
    return out
