"""Eval-mode logits of the seeded probe batch, gathered over tensor parallelism.

Compared between the saved model and the model reloaded under another topology. Pipeline
parallel forward needs a schedule; cells with pp > 1 on either side skip the logits check and
say so (their weights and quantizer state are still compared bit for bit).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .model import ModelSize, forward, sample_batch
from .quant import quantizers_bypassed

PROBE_SEED = 7
# Relative max-abs tolerance: fp32 on cpu (quantizers bypassed), bf16 + NVFP4 fake quant on GPU
# where a different TP split changes reduction order.
TOLERANCE = {"cpu": 1e-4, "gpu-shared": 5e-2, "gpu": 5e-2}


def probe_logits(model, size: ModelSize, tier: str, device) -> torch.Tensor | None:
    """Full-vocab logits on the rank that owns them (tp 0, dp 0, last stage), else None."""
    from megatron.core import parallel_state as ps

    batch = sample_batch(size, PROBE_SEED, device)
    if tier == "cpu":  # ModelOpt's NVFP4 fake-quant kernel asserts CUDA tensors
        with quantizers_bypassed(model):
            local = forward(model, batch)
    else:
        local = forward(model, batch)
    group = ps.get_tensor_model_parallel_group()
    parts = [torch.empty_like(local) for _ in range(ps.get_tensor_model_parallel_world_size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=group)
    owner = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    return torch.cat(parts, dim=-1).float().cpu() if owner else None


def save_probe(logits: torch.Tensor, reference_dir: Path, which: str) -> None:
    """``which``: "saved_model" (before saving) or "checkpoint" (reloaded at the save topology)."""
    torch.save(logits, reference_dir / f"logits_{which}.pt")


def _rel_diff(logits: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (logits - ref).abs().max().item()
    return diff, diff / max(ref.abs().max().item(), 1e-12)


def compare_probe(logits: torch.Tensor, reference_dir: Path, tier: str) -> dict:
    """Asserted: against the checkpoint's logits at the save topology. Reported: against the
    model as it was before saving (differs where its replicas disagreed)."""
    diff, rel = _rel_diff(logits, torch.load(reference_dir / "logits_checkpoint.pt"))
    _, rel_saved = _rel_diff(logits, torch.load(reference_dir / "logits_saved_model.pt"))
    return {"logits_max_abs_diff": diff, "logits_rel_diff": rel,
            "logits_rel_diff_vs_saved_model": rel_saved,
            "logits_tolerance": TOLERANCE[tier], "logits_ok": rel <= TOLERANCE[tier]}
