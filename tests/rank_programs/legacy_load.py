"""Rank program: the fix's back-compat load (moe_ckpt_fix/legacy_load.py) on 2 gloo ranks, ETP 2.

Why: the golden checkpoints need TE to load as a model; the loader's rules do not. Here two
real megatron-core torch_dist checkpoints are written with hand-built ShardedTensors named like
the TEGroupedMLP keys (expert weights sharded over the expert TP group, as Megatron shards them):
  legacy:  expert weights + ONE shared ``...experts.experts.linear_fc1.weight_quantizer._amax``
  partial: expert weights + expert 0's amax only (expert 1's was never written)
then each is loaded with a per-expert request, through megatron-core's load unwrapped (today's
failure) and wrapped. Each rank reports what it got; the test judges it.

Usage: python -m tests.rank_programs.legacy_load <out_dir>   (2 ranks under run_stage)
"""
from __future__ import annotations

import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from harness.rank.guard import pg_timeout_s, rank_main

P = "decoder.layers.0.mlp.experts.experts"
ROWS, COLS = 4, 8


def full_weight(expert: int) -> torch.Tensor:
    """Deterministic expert weight; its largest |value| sits in the ETP rank 1 half."""
    w = torch.linspace(-1, 1, ROWS * COLS).reshape(ROWS, COLS) * 0.1 * (expert + 1)
    w[ROWS - 1, 0] = -0.9 - expert / 10  # rows 2..3 belong to ETP rank 1
    return w.to(torch.bfloat16)


def _weights(rank: int, world: int, data: bool = True) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    rows = ROWS // world
    sd = {}
    for e in (0, 1):
        local = full_weight(e)[rank * rows:(rank + 1) * rows].clone()
        if not data:
            local = torch.zeros_like(local)
        sd[f"weight{e}"] = ShardedTensor.from_rank_offsets(
            f"{P}.{e}.linear_fc1.weight", local, (0, rank, world), replica_id=0)
    return sd


def _amax(key: str, value: float, rank: int):
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return ShardedTensor.from_rank_offsets(
        key, torch.tensor([value], dtype=torch.bfloat16), replica_id=(0, rank, 0))


def _request(rank: int, world: int) -> dict:
    sd = {"mlp": _weights(rank, world, data=False)}
    for e in (0, 1):
        sd["mlp"][f"weight_quantizer.{e}._amax"] = _amax(
            f"{P}.{e}.linear_fc1.weight_quantizer._amax", 0.0, rank)
    return sd


def _try_load(load, ckpt: Path, rank: int, world: int) -> dict:
    request = _request(rank, world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            state = load(request, str(ckpt))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            last = (str(exc).strip().splitlines() or [""])[-1]  # DCP puts the cause last
            return {"error": f"{type(exc).__name__}: {last[:400]}"}
    return {
        "amax": {e: state["mlp"][f"weight_quantizer.{e}._amax"].float().tolist() for e in (0, 1)},
        "request_keys": sorted(request["mlp"]),
        "warnings": [str(w.message) for w in caught if "moe-ckpt-fix" in str(w.message)],
    }


def body() -> dict:
    from harness.model.cpu_shims import apply_cpu_shims

    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
    apply_cpu_shims()
    import megatron.core.parallel_state as mpu
    from megatron.core import dist_checkpointing

    from moe_ckpt_fix.legacy_load import wrap_dist_load

    rank, world = dist.get_rank(), dist.get_world_size()
    mpu.initialize_model_parallel(1, 1, expert_model_parallel_size=1,
                                  expert_tensor_parallel_size=world)
    out = Path(sys.argv[1])
    legacy, partial = out / "legacy", out / "partial"
    if rank == 0:
        legacy.mkdir(parents=True, exist_ok=True)
        partial.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    sd = {"mlp": _weights(rank, world)}
    sd["mlp"]["weight_quantizer._amax"] = _amax(f"{P}.linear_fc1.weight_quantizer._amax", 0.25, rank)
    dist_checkpointing.save(sd, str(legacy))
    sd = {"mlp": _weights(rank, world)}
    sd["mlp"]["weight_quantizer.0._amax"] = _amax(f"{P}.0.linear_fc1.weight_quantizer._amax", 0.5, rank)
    dist_checkpointing.save(sd, str(partial))
    dist.barrier()
    wrapped = wrap_dist_load(dist_checkpointing.load)
    return {
        "unwrapped_legacy": _try_load(dist_checkpointing.load, legacy, rank, world),
        "wrapped_legacy": _try_load(wrapped, legacy, rank, world),
        "wrapped_partial": _try_load(wrapped, partial, rank, world),
    }


def main() -> None:
    rank_main(os.environ.get("HARNESS_STAGE", "legacy-load"), body)


if __name__ == "__main__":
    main()
