"""Tiny rank program for teardown tests: a few gloo collectives around injection points.

No megatron import, so a 4-rank torchrun starts in seconds. ``--no-guard`` runs the same body
without ``rank_main`` (plain torchrun behaviour, for bench/teardown.py).
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.rank import inject
from harness.rank.guard import pg_timeout_s, rank_main


def body() -> dict:
    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((8,), float(rank))
    dist.all_reduce(t)
    inject.point("after_build")
    dist.barrier()
    inject.point("before_save")
    t2 = torch.ones(16)
    dist.all_reduce(t2)
    dist.barrier()
    inject.point("before_load")
    dist.all_reduce(t2)
    dist.barrier()
    return {"rank": rank, "world": world, "sum": float(t[0]), "ones": float(t2[0])}


def main() -> None:
    if "--no-guard" in sys.argv[1:]:
        body()
        dist.destroy_process_group()
        return
    rank_main(os.environ.get("HARNESS_STAGE", "collectives"), body)


if __name__ == "__main__":
    main()
