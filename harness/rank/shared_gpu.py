"""Several NCCL ranks on one GPU, each its own host (a scenario's ``shared_gpu_nccl``).

Why: NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"); it reads the host
identity from ``NCCL_HOSTID``, and ranks of different hosts talk through its network transport,
which runs over sockets on loopback whatever GPU they share. Measured on one H100, NCCL 2.28.9:
2 and 8 ranks pass collectives and a dist_checkpointing save and load this way, and the control
without it is refused (docs/runs/20261206-0354-recipes.md). What this mode shows: NCCL's
collectives, its error, abort and watchdog paths. What it does not: NVLink, P2P, NVLS, speed.
"""
from __future__ import annotations

import os

# The controller sets it in a stage's environment (harness/run/cell.py); each rank reads it
# before its process group starts.
SHARED_GPU_ENV = "HARNESS_SHARED_GPU_NCCL"


def rank_env(rank: int) -> dict[str, str]:
    """This rank's NCCL settings in the mode: its own host id, sockets on loopback, no IB."""
    return {"NCCL_HOSTID": f"moe-ckpt-harness-rank{rank}", "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1"}


def apply(rank: int) -> bool:
    """Set this rank's settings when the stage asks for the mode; whether it did."""
    from harness.switches import switch

    if not switch(SHARED_GPU_ENV):
        return False
    os.environ.update(rank_env(rank))
    return True


def describe(world: int, gpus: int) -> str:
    """How the record and report name the mode: never a silent stand-in for one GPU per rank."""
    return f"NCCL, {world} ranks on {gpus} GPU(s), socket transport (each rank its own host)"
