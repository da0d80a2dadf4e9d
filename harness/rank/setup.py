"""Process-group and megatron parallel_state set-up for one rank of a stage."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.topology.topology import Topology


def backend_for(tier: str) -> str:
    return "nccl" if tier == "gpu" else "gloo"


def init_rank(topo: Topology, tier: str, pg_timeout_s: float) -> int:
    """Join the job's process group and build megatron's parallel groups for ``topo``."""
    from megatron.core import parallel_state as ps

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != topo.world_size:
        raise RuntimeError(f"torchrun started {world} ranks but {topo.id} needs {topo.world_size}")
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(
        backend=backend_for(tier), timeout=timedelta(seconds=pg_timeout_s)
    )
    ps.initialize_model_parallel(
        tensor_model_parallel_size=topo.tp,
        pipeline_model_parallel_size=topo.pp,
        expert_model_parallel_size=topo.ep,
        expert_tensor_parallel_size=topo.etp,
    )
    return rank
