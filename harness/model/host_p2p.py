"""Pipeline point-to-point for tier gpu-shared: CUDA activations staged through host memory.

Tier gpu-shared runs several ranks per GPU over gloo, and gloo cannot send CUDA tensors point
to point (seen on the H200: ``writev ... Bad address``). megatron-core's pipeline schedule has
one documented hook for another transport: with ``use_ring_exchange_p2p=True`` in the model
config it hands every exchange to ``torch.distributed.ring_exchange`` (normally provided only
by a custom torch build). This module provides that function: each tensor is copied to the
host, exchanged with gloo's ``isend``/``irecv`` between the same global ranks megatron chose,
and the received data is copied back into megatron's CUDA buffer. The schedule itself, the
stage split and the order of the exchanges stay megatron-core's own.

Tier gpu (NCCL) never uses it: NCCL sends CUDA tensors directly.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def needs_host_staging() -> bool:
    """True when ranks run on CUDA but the process groups are gloo (tier gpu-shared)."""
    return (torch.cuda.is_available() and dist.is_available() and dist.is_initialized()
            and dist.get_backend() == "gloo")


def install() -> None:
    """Make ``torch.distributed.ring_exchange`` the host-staged exchange (idempotent)."""
    dist.ring_exchange = host_staged_ring_exchange


def host_staged_ring_exchange(*, tensor_send_prev=None, tensor_recv_prev=None,
                              tensor_send_next=None, tensor_recv_next=None, group=None,
                              prev_pipeline_rank=None, next_pipeline_rank=None) -> None:
    """Blocking exchange with the previous and next pipeline stage, as megatron calls it.

    All sends and receives are posted before any is waited on, so two neighbours that both send
    first cannot deadlock. ``*_pipeline_rank`` are global ranks (megatron passes them)."""
    if prev_pipeline_rank is None or next_pipeline_rank is None:
        prev_pipeline_rank, next_pipeline_rank = _neighbours(group)
    posted, landing = [], []
    for tensor, peer in ((tensor_send_prev, prev_pipeline_rank),
                         (tensor_send_next, next_pipeline_rank)):
        if tensor is not None:
            host = tensor.detach().to("cpu", copy=True).contiguous()
            posted.append((dist.isend(host, dst=peer, group=group), host))
    for tensor, peer in ((tensor_recv_prev, prev_pipeline_rank),
                         (tensor_recv_next, next_pipeline_rank)):
        if tensor is not None:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
            posted.append((dist.irecv(host, src=peer, group=group), host))
            landing.append((tensor, host))
    for work, _ in posted:
        work.wait()
    with torch.no_grad():  # megatron's receive buffers are leaves with requires_grad=True
        for tensor, host in landing:
            tensor.copy_(host)


def _neighbours(group) -> tuple[int, int]:
    """Global ranks of the previous and next stage in ``group`` (a ring, as megatron's)."""
    ranks = dist.get_process_group_ranks(group)
    i = ranks.index(dist.get_rank())
    return ranks[(i - 1) % len(ranks)], ranks[(i + 1) % len(ranks)]
