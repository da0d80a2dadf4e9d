"""Rank-side probes of the REAL megatron-core sharding validation, without a model.

``oracle``: for every topology of one world size, build the per-expert weight-quantizer amax
ShardedTensors the way modelopt 0.47.0's ``_QuantMegatronTEGroupedLinear`` does (buggy rule:
``make_sharded_tensors_for_checkpoint`` with no groups, then replica_id[2] := expert-DP rank) and
the fixed way (expert TP and expert DP groups), then run megatron-core's own
``validate_sharding_integrity``. This cross-checks harness/topology/oracle.py on gloo ranks.

``save``: a real ``dist_checkpointing.save`` of those entries (the report's failure and its
teardown, on CPU).

``replay``: rebuild ShardedTensors from metadata recorded on GPUs (real TE + ModelOpt runs,
tests/data/recorded/*.json) and run the same real validation on this rank's recorded entries.

Run as ``torchrun ... -m harness.rank.validation_probes <probe-spec.json>`` under the rank guard
(started by harness/run/validation_probes.py).
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch



def validation_error(sharded_sd) -> str | None:
    """Real megatron-core validation; the error text on rank 0, None when valid."""
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from megatron.core.dist_checkpointing.validation import (
        determine_global_metadata,
        validate_sharding_integrity,
    )

    _, global_metadata = determine_global_metadata(sharded_sd)
    try:
        validate_sharding_integrity(global_metadata)
    except CheckpointingException as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def takes_groups() -> bool:
    """megatron-core >= 0.16's make_sharded_tensors_for_checkpoint takes tp_group/dp_cp_group
    (0.16.1 transformer/utils.py:81-82); 0.15.x's does not (0.15.3 transformer/utils.py:76-82)."""
    import inspect

    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    return "tp_group" in inspect.signature(make_sharded_tensors_for_checkpoint).parameters


def _expert_tp_ranked(make):
    """``make`` with the tensor-parallel rank swapped for the expert-TP rank, the way megatron-core
    < 0.16 does it around every expert layer's sharded_state_dict: its own
    ``expert_dist_ckpt_decorator`` (0.15.3 transformer/moe/experts.py:62-94, applied to
    TEGroupedMLP.sharded_state_dict at :965). Version-gated shim: only used where the group
    arguments do not exist."""
    from megatron.core.transformer.moe.experts import expert_dist_ckpt_decorator

    return expert_dist_ckpt_decorator(make)


def shared_amax_entries() -> dict:
    """A grouped linear's shared ``input_quantizer._amax``: one key per pp stage, made with
    megatron-core's defaults (ModelOpt 0.47.0/0.48.0rc1 make it so), under the decorator where
    megatron-core has one."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    layer = ps.get_pipeline_model_parallel_rank()
    make = make_sharded_tensors_for_checkpoint if takes_groups() else _expert_tp_ranked(
        make_sharded_tensors_for_checkpoint)
    return make({"input_quantizer._amax": torch.ones(1)},
                f"decoder.layers.{layer}.mlp.experts.experts.linear_fc1.", {}, ())


def expert_amax_entries(rule: str, num_local: int) -> dict:
    """Per-expert ``weight_quantizer.{i}._amax`` ShardedTensors for this rank (singleton keys)."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    ep_rank = ps.get_expert_model_parallel_rank()
    edp_group = ps.get_expert_data_parallel_group()
    layer = ps.get_pipeline_model_parallel_rank()  # each pipeline stage owns its own layers
    prefix = f"decoder.layers.{layer}.mlp.experts."
    out = {}
    for i in range(num_local):
        g = ep_rank * num_local + i
        state = {f"{i}.weight_quantizer._amax": torch.ones(1)}
        if rule == "buggy":  # modelopt 0.47.0: dense TP/DP groups, then edp into replica_id[2]
            sub = make_sharded_tensors_for_checkpoint(state, "", {}, ())
            for sh in sub.values():
                sh.replica_id = (*sh.replica_id[:2], edp_group.rank())
        elif takes_groups():  # fixed: expert TP and expert DP groups, as Megatron does for weights
            sub = make_sharded_tensors_for_checkpoint(
                state, "", {}, (),
                tp_group=ps.get_expert_tensor_parallel_group(), dp_cp_group=edp_group,
            )
        else:  # fixed on megatron-core < 0.16: the decorator's expert-TP rank, then edp
            sub = _expert_tp_ranked(make_sharded_tensors_for_checkpoint)(state, "", {}, ())
            for sh in sub.values():
                sh.replica_id = (*sh.replica_id[:2], edp_group.rank())
        replace_prefix_for_sharding(sub, f"{i}.", f"{prefix}experts.{g}.linear_fc1.")
        out.update({f"{prefix}linear_fc1.weight_quantizer.{i}._amax": sh for sh in sub.values()})
    return out


def probe_oracle(topologies: list[str], num_experts: int) -> dict:
    from megatron.core import parallel_state as ps

    from harness.topology.topology import Topology

    results = {}
    for text in topologies:
        topo = Topology.parse(text)
        ps.initialize_model_parallel(
            tensor_model_parallel_size=topo.tp, pipeline_model_parallel_size=topo.pp,
            expert_model_parallel_size=topo.ep, expert_tensor_parallel_size=topo.etp,
            create_gloo_process_groups=False,  # the default group is gloo already
        )
        results[topo.id] = {
            rule: validation_error(expert_amax_entries(rule, num_experts // topo.ep))
            for rule in ("buggy", "fixed")
        }
        results[topo.id]["shared"] = validation_error(shared_amax_entries())
        ps.destroy_model_parallel()
    return results


def sharded_tensors_from_record(entries: list[dict]) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    out = {}
    for n, e in enumerate(entries):
        dtype = getattr(torch, e["dtype"].removeprefix("torch."))
        data_shape = e["local_shape"][e.get("prepend_axis_num", 0):]
        out[f"{n}"] = ShardedTensor(
            key=e["key"], data=torch.zeros(data_shape, dtype=dtype), dtype=dtype,
            local_shape=tuple(e["local_shape"]), global_shape=tuple(e["global_shape"]),
            global_offset=tuple(e["global_offset"]),
            axis_fragmentations=tuple(e["axis_fragmentations"]),
            replica_id=tuple(e["replica_id"]) if isinstance(e["replica_id"], list) else e["replica_id"],
            prepend_axis_num=e.get("prepend_axis_num", 0),
        )
    return out


def probe_replay(recording: str) -> dict:
    rank = torch.distributed.get_rank()
    doc = json.loads(Path(recording).read_text())
    entries = [e for e in doc["entries"] if e["rank"] == rank]
    return {"recording": recording, "error": validation_error(sharded_tensors_from_record(entries))}


def probe_save(topology: str, rule: str, num_experts: int, ckpt_dir: str) -> dict:
    """The report's failure mode, for real: ``dist_checkpointing.save`` of per-expert amax
    entries built by ``rule``. Under the buggy rule global rank 0's validation raises
    CheckpointingException while the other ranks walk on into the save's next collective."""
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    from harness.model.cpu_shims import apply_cpu_shims
    from harness.topology.topology import Topology

    apply_cpu_shims()
    topo = Topology.parse(topology)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=topo.tp, pipeline_model_parallel_size=topo.pp,
        expert_model_parallel_size=topo.ep, expert_tensor_parallel_size=topo.etp,
    )
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(expert_amax_entries(rule, num_experts // topo.ep), ckpt_dir)
    return {"saved": ckpt_dir}


def main(argv: list[str]) -> None:
    from datetime import timedelta

    from harness.rank.guard import pg_timeout_s, rank_main

    warnings.filterwarnings("ignore")
    spec = json.loads(Path(argv[0]).read_text())

    def body() -> dict:
        torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
        if spec["probe"] == "oracle":
            return {"results": probe_oracle(spec["topologies"], spec["num_experts"])}
        if spec["probe"] == "save":
            return probe_save(spec["topology"], spec["rule"], spec["num_experts"], spec["ckpt"])
        return {"replays": [probe_replay(r) for r in spec["recordings"]]}

    rank_main(f"probe-{spec['probe']}", body)


if __name__ == "__main__":
    main(sys.argv[1:])
