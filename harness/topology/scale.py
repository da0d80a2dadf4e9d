"""Scale by simulation: megatron-core's REAL ``validate_sharding_integrity`` on per-expert
weight-quantizer amax metadata synthesized for production world sizes (64..1024 ranks).

Why: no GPU job of that size can be started to watch the bug fire, but validation is a pure
function of every rank's metadata, so feeding it the metadata those ranks would gather decides
the verdict exactly, for the entries synthesized. Only the per-expert ``_amax`` entries (the
keys that collide) are built, from the structure of the real metadata recorded on an H200
(tests/data/recorded/; `cross_check` proves the synthesis reproduces it). No model, no process.

Replica ids per rule (modelopt 0.47.0 ``_QuantMegatronTEGroupedLinear.sharded_state_dict``):
buggy ``(0, dense TP rank, expert DP rank)``, fixed ``(0, expert TP rank, expert DP rank)``
(harness/topology/oracle.py ``replica_id``); coordinates from megatron's RankGenerator (coords.py).
"""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from unittest import mock

from harness.topology.coords import rank_coords
from harness.topology.oracle import RULES, replica_id
from harness.topology.topology import Topology

# The recorded key layout (TEGroupedMLP, singleton_local_shards: global layer and expert index).
KEY = "decoder.layers.{layer}.mlp.experts.experts.{expert}.linear_fc{fc}.weight_quantizer._amax"
KEY_RE = re.compile(
    r"^decoder\.layers\.\d+\.mlp\.experts\.experts\.\d+\.linear_fc[12]\.weight_quantizer\._amax$"
)
_FAILING_KEY = re.compile(r"Invalid access pattern for ShardedTensor\(key='([^']+)'")


def synthesize(topology: Topology | str, num_experts: int, num_layers: int, rule: str) -> list[list]:
    """Per rank, the expert-amax ShardedTensors (data stripped, as validation receives them).

    ``num_layers``: MoE layers of the whole model; pipeline stage s holds the s-th contiguous
    block (megatron's uniform split) and keys carry the global layer index, as the recording does.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    import torch

    topo = Topology.parse(topology) if isinstance(topology, str) else topology
    if rule not in RULES:
        raise ValueError(f"unknown replica rule {rule!r}; expected one of {RULES}")
    if num_experts % topo.ep or num_layers % topo.pp:
        raise ValueError(f"{num_experts} experts / {num_layers} layers do not split over {topo.id}")
    local, per_stage = num_experts // topo.ep, num_layers // topo.pp
    out = []
    for c in rank_coords(topo):
        rid = replica_id(c, rule)
        layers = range(c.pp * per_stage, (c.pp + 1) * per_stage)
        experts = range(c.ep * local, (c.ep + 1) * local)
        out.append([
            ShardedTensor(
                key=KEY.format(layer=layer, expert=g, fc=fc), data=None, dtype=torch.bfloat16,
                local_shape=(1,), global_shape=(1,), global_offset=(0,),
                axis_fragmentations=(1,), replica_id=rid, prepend_axis_num=0,
            )
            for layer in layers for fc in (1, 2) for g in experts
        ])
    return out


@contextlib.contextmanager
def _as_global_rank_zero():
    """validate_sharding_integrity only checks on global rank 0 and asks torch.distributed which
    rank this is; with no process group (one process holding every rank's metadata) answer 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_rank() != 0:
            raise RuntimeError("simulated validation must run where get_rank() == 0")
        yield
        return
    with mock.patch.object(dist, "get_rank", lambda group=None: 0):
        yield


def validate(per_rank: list[list]) -> list[str]:
    """Keys the REAL megatron-core validation refuses (sorted); [] when it accepts."""
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from megatron.core.dist_checkpointing.validation import validate_sharding_integrity

    with _as_global_rank_zero():
        try:
            validate_sharding_integrity(per_rank)
        except CheckpointingException as exc:
            keys = sorted(set(_FAILING_KEY.findall(str(exc))))
            if not keys:
                raise  # refused for a reason this simulation does not model: say so loudly
            return keys
    return []


def failing_keys(error: str | None) -> list[str]:
    """The refused keys named in a recorded validation error."""
    return sorted(set(_FAILING_KEY.findall(error or "")))


def _fields(sh) -> tuple:
    rid = tuple(sh["replica_id"]) if isinstance(sh, dict) else tuple(sh.replica_id)
    if isinstance(sh, dict):
        return (sh["key"], tuple(sh["global_shape"]), tuple(sh["global_offset"]), rid,
                tuple(sh["local_shape"]), tuple(sh["axis_fragmentations"]), sh["dtype"],
                sh.get("prepend_axis_num", 0))
    return (sh.key, sh.global_shape, sh.global_offset, rid, sh.local_shape,
            sh.axis_fragmentations, str(sh.dtype), sh.prepend_axis_num)


def cross_check(recording: Path | str | dict, rule: str) -> list[str]:
    """Differences between the synthesis and one recording of REAL metadata; [] when equal.

    ``rule``: the recorded ModelOpt version's rule (the fix's rule for a patched recording); the
    caller decides it (harness/check/versions.py), since topology/ imports no other package.
    Compares every expert-amax field per rank, and the real validation's verdict and failing keys
    on the synthesis with the verdict recorded on the GPU.
    """
    doc = recording if isinstance(recording, dict) else json.loads(Path(recording).read_text())
    size = doc["provenance"]["model"]
    synth = synthesize(doc["topology"], size["num_experts"], size["num_layers"], rule)
    problems = []
    if len(synth) != doc["world"]:
        problems.append(f"world {len(synth)} != recorded {doc['world']}")
    for rank, mine in enumerate(synth):
        want = sorted(_fields(e) for e in doc["entries"] if e["rank"] == rank and KEY_RE.match(e["key"]))
        got = sorted(_fields(sh) for sh in mine)
        if got != want:
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            problems.append(f"rank {rank}: synthesized-only {extra[:3]}, recorded-only {missing[:3]}"
                            f" ({len(extra)}/{len(missing)})")
    got_fail, want_fail = validate(synth), failing_keys(doc["validation_error"])
    if (doc["validation_error"] is None) != (not got_fail) or got_fail != want_fail:
        problems.append(f"verdict: simulated failing keys {got_fail[:3]} ({len(got_fail)}), "
                        f"recorded {want_fail[:3]} ({len(want_fail)})")
    return problems
