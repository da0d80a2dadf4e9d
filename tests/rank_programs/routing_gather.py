"""Rank program for tests/test_host_p2p.py: router records of two pipeline stages merged on
every rank of the pipeline group (harness/rank/logits.py), megatron parallel state on gloo."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.rank.guard import pg_timeout_s, rank_main


def body() -> dict:
    from megatron.core import parallel_state as ps

    from harness.rank.logits import _routing_of_all_stages

    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    stage = ps.get_pipeline_model_parallel_rank()
    mine = {f"layer{stage + 1}": torch.full((4, 2), bool(stage))}
    merged = _routing_of_all_stages(mine)
    return {"stage": stage, "layers": sorted(merged),
            "values": {k: bool(v.all()) for k, v in merged.items()}}


if __name__ == "__main__":
    rank_main(os.environ.get("HARNESS_STAGE", "routing-gather"), body)
