"""Rank program: write a torch_dist checkpoint of hand-built ShardedTensors (world 1, gloo, CPU).

Why: tests of the checkpoint inspector and of golden manifests need real megatron-core
checkpoints whose keys, shapes and dtypes are those of the GPU recordings, without a GPU and
without building (and quantizing) a model. The save is megatron-core's real torch_dist writer;
only the CUDA calls are shimmed (harness.model.cpu_shims).

Usage (one rank, under torchrun / harness.launch.torchrun.run_stage):
    python -m tests.rank_programs.make_ckpt <spec.json>
spec.json = {"checkpoints": [{"out": dir, "seed": int, "tensors": [{"key", "dtype", "shape"}...]}]}
(several checkpoints per run: the imports, not the saves, take most of the ~30 s)
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from harness.rank.guard import pg_timeout_s, rank_main


def _tensor(gen: torch.Generator, dtype: str, shape: list[int]) -> torch.Tensor:
    dt = getattr(torch, dtype.removeprefix("torch."))
    return torch.rand(shape, generator=gen, dtype=torch.float32).add_(0.5).to(dt)


def build_and_save(spec: dict) -> dict:
    from harness.model.cpu_shims import apply_cpu_shims

    apply_cpu_shims()
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    gen = torch.Generator().manual_seed(int(spec.get("seed", 0)))
    sd = {}
    for t in spec["tensors"]:
        sd[t["key"]] = ShardedTensor.from_rank_offsets(
            t["key"], _tensor(gen, t["dtype"], t["shape"]), replica_id=0
        )
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(sd, str(out))
    return {"tensors": len(sd), "out": str(out)}


def body() -> dict:
    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
    spec = json.loads(Path(sys.argv[1]).read_text())
    results = [build_and_save(c) for c in spec["checkpoints"]]
    dist.barrier()
    return {"checkpoints": results}


def main() -> None:
    rank_main(os.environ.get("HARNESS_STAGE", "make-ckpt"), body)


if __name__ == "__main__":
    main()
