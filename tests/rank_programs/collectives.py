"""Tiny rank program for teardown tests: a few collectives around injection points.

No megatron import, so a 4-rank torchrun starts in seconds. ``--no-guard`` runs the same body
without ``rank_main`` (plain torchrun behaviour, for bench/teardown.py). Gloo on CPU tensors by
default; ``HARNESS_COLLECTIVES_BACKEND=nccl`` runs NCCL on CUDA tensors (bench/teardown.py
``--nccl-shared-gpu``: every rank on GPU 0, each its own NCCL host, harness/rank/shared_gpu.py).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.rank import inject
from harness.rank.guard import pg_timeout_s, rank_main


STARTUP_TIMEOUT_S = 300.0
# =1: the injected rank's peers ignore SIGTERM and wait outside Python at the injection point,
# as NCCL ranks blocked in a collective do (their Python signal handler never runs): only a
# SIGKILL ends them (bench/teardown.py --deaf-peers)
DEAF_PEERS_ENV = "HARNESS_DEAF_PEERS"


def wait_for_every_rank() -> None:
    """Meet on torchrun's store, under a long timeout, before the process group exists.

    The group's timeout is the short one the tests time (HARNESS_PG_TIMEOUT_S, 6 s); its
    rendezvous runs under it too. On a loaded machine one rank may finish importing torch many
    seconds after its peers, which must not read as a failure of the job.
    """
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
    arrived = store.add("collectives/arrived", 1)
    # One line per rank in its log: a clean fork-mode stage of tests/test_teardown.py once had
    # all 4 ranks waiting here until the stage timeout (2026-12-07 clean-clone make test, seen
    # once); which count each rank got, on which store, says next time whether they met at all.
    print(f"[collectives] rank {os.environ['RANK']} arrived {arrived}/{world} at "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    if arrived == world:
        store.set("collectives/all-up", "1")
    store.wait(["collectives/all-up"])


def _backend() -> tuple[str, str]:
    """(process-group backend, tensor device) this program runs with."""
    if os.environ.get("HARNESS_COLLECTIVES_BACKEND", "gloo") != "nccl":
        return "gloo", "cpu"
    from harness.rank import shared_gpu

    shared_gpu.apply(int(os.environ["RANK"]))
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    return "nccl", "cuda"


def body() -> dict:
    wait_for_every_rank()
    backend, dev = _backend()
    dist.init_process_group(backend, timeout=timedelta(seconds=pg_timeout_s()))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((8,), float(rank), device=dev)
    dist.all_reduce(t)
    inject.point("after_build")
    dist.barrier()
    inject.point("before_save")
    if os.environ.get(DEAF_PEERS_ENV) == "1":  # the injected rank failed above; its peers:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(STARTUP_TIMEOUT_S)
    t2 = torch.ones(16, device=dev)
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
