"""Record every rank's sharded-state-dict metadata for one topology, with provenance.

Recordings made on GPUs with the real TE ``TEGroupedMLP`` + ModelOpt code path are committed
under tests/data/recorded/ and replayed on the cpu tier through megatron-core's real
validation (harness/rank/validation_probes.py, ``validation_error``), tying the CPU oracle to what the GPU code really emits.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def entries(sharded_sd, rank: int) -> list[dict]:
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    out = []
    for sh in nested_values(sharded_sd):
        if not isinstance(sh, ShardedTensor):
            continue
        out.append({
            "rank": rank, "key": sh.key, "dtype": str(sh.dtype),
            "local_shape": list(sh.local_shape), "global_shape": list(sh.global_shape),
            "global_offset": list(sh.global_offset),
            "axis_fragmentations": list(sh.axis_fragmentations),
            "replica_id": list(sh.replica_id) if isinstance(sh.replica_id, tuple) else sh.replica_id,
            "prepend_axis_num": sh.prepend_axis_num,
        })
    return out


def write_recording(path: Path, spec, gathered: list[list[dict]], validation: str | None) -> None:
    from harness.machine import versions

    import modelopt

    doc = {
        "provenance": {
            **versions(),
            "nvidia-modelopt": modelopt.__version__,  # the one imported (may shadow the installed)
            "tier": spec.tier, "backend": spec.backend, "patch": spec.patch,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "singleton_local_shards": spec.singleton_local_shards,
            "model": spec.size,
        },
        "topology": spec.topology,
        "world": len(gathered),
        "validation_error": validation,
        "entries": [e for rank_entries in gathered for e in rank_entries],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def record_stage(spec) -> dict:
    """Stage body: quantize under ``spec.topology`` and record the metadata (no checkpoint)."""
    from harness.model.checkpoint import sharded_metadata
    from harness.model.quant import quantize
    from harness.rank.validation_probes import validation_error
    from harness.rank.setup import Clock, device, prepare_rank

    clock = Clock()
    rank, model = prepare_rank(spec, clock)
    quantize(model, spec.model_size, device(), spec.recipe)
    sd = model.sharded_state_dict(metadata=sharded_metadata(spec.singleton_local_shards))
    mine = entries(sd, rank)
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, mine)
    validation = validation_error(sd)
    if rank == 0:
        write_recording(Path(spec.output), spec, gathered, validation)
    clock.lap("dump")
    return {"durations": clock.durations, "entries": len(mine), "validation_error": validation}
