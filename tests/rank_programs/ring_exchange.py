"""Rank program for tests/test_host_p2p.py: the host-staged pipeline exchange between 4 gloo
ranks in one pipeline ring, each sending to both neighbours at once (the deadlock-prone case)."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.model.host_p2p import host_staged_ring_exchange
from harness.rank.guard import pg_timeout_s, rank_main


def body() -> dict:
    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    prev, nxt = (rank - 1) % world, (rank + 1) % world
    recv_prev = torch.empty(3, 5, requires_grad=True)  # as megatron allocates its buffers
    recv_next = torch.empty(3, 5, requires_grad=True)
    host_staged_ring_exchange(
        tensor_send_prev=torch.full((3, 5), 100.0 + rank), tensor_recv_prev=recv_prev,
        tensor_send_next=torch.full((3, 5), float(rank)), tensor_recv_next=recv_next,
        group=group, prev_pipeline_rank=prev, next_pipeline_rank=nxt)
    only_next = torch.empty(2)  # the shape path: no ranks given, neighbours from the group
    host_staged_ring_exchange(tensor_send_prev=torch.tensor([7.0, float(rank)]),
                              tensor_recv_next=only_next, group=group)
    return {"rank": rank, "from_prev": recv_prev.detach().unique().tolist(),
            "from_next": recv_next.detach().unique().tolist(), "only_next": only_next.tolist()}


if __name__ == "__main__":
    rank_main(os.environ.get("HARNESS_STAGE", "ring-exchange"), body)
