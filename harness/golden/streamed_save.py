"""A megatron-core torch_dist checkpoint written one tensor at a time (repair, synthetic goldens).

Why: a repaired or synthesized checkpoint can be larger than memory; its state dict holds meta
tensors, and each tensor is made by ``produce(key)`` only when torch DCP's writer asks for it,
then freed once written, so peak memory is about one tensor.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable


class OneAtATime:
    """Hands tensors to torch DCP's FileSystemWriter and frees the storage of the one handed out
    before. Why: the writer keeps every tensor it wrote in a dict until the file is closed (torch
    2.13 distributed/checkpoint/filesystem.py:451, ``tensor_dict``, used only for safetensors),
    so a one-file checkpoint would otherwise stay whole in memory. Safe only with the writer's
    serial loader (``per_thread_copy_ahead=0``: each tensor is written before the next is asked
    for); ``writer()`` builds it so."""

    def __init__(self):
        self.previous = None

    def __call__(self, tensor):
        if not tensor.untyped_storage().resizable():  # e.g. a view of the reader's buffer
            tensor = tensor.clone()
        if self.previous is not None:
            self.previous.untyped_storage().resize_(0)
        self.previous = tensor
        return tensor

    @staticmethod
    def writer(path: Path):
        import torch.distributed.checkpoint as dcp

        return dcp.FileSystemWriter(str(path), thread_count=1, per_thread_copy_ahead=0)


def save_streamed(state: dict, out: Path, produce: Callable[[str], "torch.Tensor"]) -> None:
    """``torch.distributed.checkpoint.save`` of ``state`` (meta tensors and serialized objects)
    into ``out`` with megatron-core's planner; tensor ``key`` comes from ``produce(key)``."""
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.strategies.torch import MCoreSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    hand_out = OneAtATime()

    class Streaming(MCoreSavePlanner):
        """megatron-core's planner (objects are already serialized bytes); tensors come from
        ``produce`` when the writer asks for them, not from the state dict."""

        def resolve_data(self, write_item):
            if write_item.type == WriteItemType.BYTE_IO:
                return super().resolve_data(write_item)
            return hand_out(produce(write_item.index.fqn))

    dcp.save(state, storage_writer=OneAtATime.writer(out),
             planner=Streaming(flatten_state_dict=False, can_run_decentralized_global_plan=False))
