"""Synthetic MoE torch_dist checkpoints of any key count, for the repair tests and bench/repair.py.

Why: the committed goldens are the harness's 2-layer, 8-expert GPT; ``inspect`` and ``repair``
must work on any model's checkpoint (keys found by pattern) and at the quarantined jobs' key
counts (Nano: 23 MoE layers x 128 experts) on a CPU-only machine. This writes one in the format
megatron-core's torch_dist strategy writes: torch DCP files, ShardedObjects as ``torch.save([data])``
bytes under ``<key>/shard_0_1``, ``metadata.json`` naming the backend, and a ``modelopt_state/``
sibling. Not a checkpoint of a real model: the values are random, the layout is the point.
One DCP save whose tensors are made when the writer asks for them, so memory stays at one
tensor whatever the key count.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from harness.check.layouts import GoldenLayout
from harness.golden.streamed_save import save_streamed

SHARED, INCOMPLETE, COMPLETE = GoldenLayout.SHARED, GoldenLayout.INCOMPLETE, GoldenLayout.COMPLETE


def _extra_state(weight_quantizer_names: list[str]) -> io.BytesIO:
    """A ModelOpt-style expert-linear ``_extra_state`` ShardedObject (the encoding of the goldens)."""
    import torch

    cfg = {"_num_bits": (2, 1), "_block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)},
           "_disabled": False,
           "_pytorch_state_metadata": {"params": {}, "buffers": {"_amax": {"shape": torch.Size([]),
                                                                           "dtype": torch.bfloat16}}}}
    state = {"modelopt_quantizer_state": {"input_quantizer": dict(cfg),
                                          **{n: dict(cfg) for n in weight_quantizer_names},
                                          "output_quantizer": {"_disabled": True}},
             "modelopt_real_quantizer_state": None, "modelopt_q_tensor_state": None}
    inner = io.BytesIO()
    torch.save(state, inner)
    outer = io.BytesIO()
    torch.save([torch.frombuffer(bytearray(inner.getvalue()), dtype=torch.uint8)], outer)
    outer.seek(0)
    return outer


def keys_and_shapes(layers: int, experts: int, hidden: int, ffn: int, layout: str,
                    prefix: str = "decoder", missing_from: int | None = None):
    """(tensor key -> shape, object keys) of the synthetic model. ``missing_from``: incomplete
    layout, experts >= it lack their weight amax (as an unvalidated TP != ETP save leaves them)."""
    tensors: dict[str, tuple[int, ...]] = {f"{prefix}.embedding.word_embeddings.weight": (64, hidden)}
    objects: dict[str, list[str]] = {}
    missing_from = experts // 2 if missing_from is None else missing_from
    for layer in range(layers):
        lp = f"{prefix}.layers.{layer}"
        tensors[f"{lp}.self_attention.linear_qkv.weight"] = (3 * hidden, hidden)
        tensors[f"{lp}.mlp.router.weight"] = (experts, hidden)
        grouped = f"{lp}.mlp.experts.experts"
        for lin, shape in (("linear_fc1", (ffn, hidden)), ("linear_fc2", (hidden, ffn))):
            tensors[f"{grouped}.{lin}.input_quantizer._amax"] = (1,)
            if layout == SHARED:
                tensors[f"{grouped}.{lin}.weight_quantizer._amax"] = (1,)
            for e in range(experts):
                tensors[f"{grouped}.{e}.{lin}.weight"] = shape
                if layout == COMPLETE or (layout == INCOMPLETE and e < missing_from):
                    tensors[f"{grouped}.{e}.{lin}.weight_quantizer._amax"] = (1,)
                names = ["weight_quantizer"] if layout == SHARED else ["weight_quantizer.0"]
                objects[f"{grouped}.{e}.{lin}._extra_state/shard_0_1"] = names
    return tensors, objects


def synthesize(out: Path | str, *, layers: int, experts: int, hidden: int = 16, ffn: int = 32,
               layout: str = SHARED, prefix: str = "decoder", seed: int = 0) -> Path:
    """Write the checkpoint to ``out`` (must not exist); tensors are made one at a time."""
    import torch
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.strategies.torch import MCoreSavePlanner

    out = Path(out)
    tensors, objects = keys_and_shapes(layers, experts, hidden, ffn, layout, prefix)
    state: dict = {k: torch.empty(s, dtype=torch.bfloat16, device="meta") for k, s in tensors.items()}
    state.update({k: _extra_state(v) for k, v in objects.items()})
    weights = {k: i for i, k in enumerate(sorted(tensors))}

    def produce(key: str):
        g = torch.Generator().manual_seed(seed * 1_000_003 + weights[key])
        t = torch.randn(tensors[key], generator=g, dtype=torch.float32)
        if key.endswith("_amax"):  # a positive per-tensor amax
            t = t.abs() + 0.5
        return t.to(torch.bfloat16)

    save_streamed(state, out, produce)
    backend = {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
    (out / "metadata.json").write_text(json.dumps(backend))
    ms = out / "modelopt_state"
    dcp.save({"common_state/shard_0_1": _wrap({"modelopt_version": "synthetic"})},
             storage_writer=dcp.FileSystemWriter(str(ms), thread_count=1),
             planner=MCoreSavePlanner(flatten_state_dict=False, can_run_decentralized_global_plan=False))
    (ms / "metadata.json").write_text(json.dumps(backend))
    return out


def _wrap(obj) -> io.BytesIO:
    import torch

    b = io.BytesIO()
    torch.save([obj], b)
    b.seek(0)
    return b
