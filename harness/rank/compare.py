"""Topology-independent comparison of model state through ShardedTensor global coordinates.

The save stage records every ShardedTensor of the saved model (key, global offset, local data)
from every rank. A load stage under any other topology rebuilds the global tensors from those
records and checks each of ITS ShardedTensors -- taken from the model after ``load_state_dict``,
the normal resume path -- bit for bit against the matching global slice. Weights, per-expert
quantizer amax and every other tensor are covered by the same rule; keys the saved model had and
no load rank has (e.g. an expert amax dropped after load) are reported as missing.

Rank side: the save and load stages (harness/rank/stages.py) capture and compare here; the
controller judges the figures (harness/check/judge.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.check.keys import PER_EXPERT_WEIGHT_AMAX, is_expert_weight_amax
from harness.records import AMAX_STATES


def _sharded_tensors(sharded_sd):
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    for sh in nested_values(sharded_sd):
        if isinstance(sh, ShardedTensor) and sh.flattened_range is None:
            yield sh


def _local_view(sh) -> torch.Tensor:
    return sh.data.detach().to("cpu").reshape(sh.local_shape)


def _slices(sh) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(sh.global_offset, sh.local_shape))


def capture(sharded_sd) -> list[dict]:
    """This rank's shards, as plain data that can be torch.save'd and read under any topology."""
    return [
        {
            "key": sh.key,
            "global_shape": tuple(sh.global_shape),
            "global_offset": tuple(sh.global_offset),
            "local_shape": tuple(sh.local_shape),
            "replica_id": sh.replica_id,
            "data": _local_view(sh).clone(),
        }
        for sh in _sharded_tensors(sharded_sd)
    ]


def save_reference(sharded_sd, reference_dir: Path, rank: int) -> int:
    reference_dir.mkdir(parents=True, exist_ok=True)
    shards = capture(sharded_sd)
    torch.save(shards, reference_dir / f"shards_rank{rank}.pt")
    return len(shards)


def load_reference(reference_dir: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Global tensors assembled from every saved rank's shards, main replicas winning, and the
    keys whose replicas held DIFFERENT values in the saved model (a checkpoint keeps one of them,
    so such state cannot survive any reload exactly)."""
    files = sorted(reference_dir.glob("shards_rank*.pt"))
    if not files:
        raise FileNotFoundError(f"no reference shards in {reference_dir}; did the save stage run?")
    shards = [s for f in files for s in torch.load(f, weights_only=False)]
    shards.sort(key=lambda s: not _is_main(s["replica_id"]))  # main replicas first
    full: dict[str, torch.Tensor] = {}
    filled: dict[str, torch.Tensor] = {}
    disagree: set[str] = set()
    for s in shards:
        key = s["key"]
        if key not in full:
            full[key] = torch.empty(s["global_shape"], dtype=s["data"].dtype)
            filled[key] = torch.zeros(s["global_shape"], dtype=torch.bool)
        idx = tuple(slice(o, o + n) for o, n in zip(s["global_offset"], s["local_shape"]))
        if filled[key][idx].all():
            if not torch.equal(full[key][idx], s["data"]):
                disagree.add(key)
            continue
        full[key][idx] = s["data"]
        filled[key][idx] = True
    return full, sorted(disagree)


def _is_main(replica_id) -> bool:
    return replica_id == 0 or (isinstance(replica_id, tuple) and all(r == 0 for r in replica_id))


@dataclass
class Comparison:
    keys_compared: int = 0
    expert_amax_compared: int = 0
    mismatches: list[dict] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    present_keys: list[str] = field(default_factory=list)
    expert_amax: dict[str, str] = field(default_factory=dict)  # key -> AMAX_STATES entry

    def as_dict(self) -> dict:
        return {
            "keys_compared": self.keys_compared,
            "expert_amax_compared": self.expert_amax_compared,
            "mismatches": self.mismatches[:20],
            "mismatch_count": len(self.mismatches),
            "unexpected_keys": self.unexpected_keys[:20],
        }


def _amax_state(got: torch.Tensor, want: torch.Tensor, siblings=()) -> str:
    """The AMAX_STATES entry of one loaded expert amax; ``siblings``: the checkpoint's values for
    the other experts of its layer and linear, at the same slice (looked at only when the value
    differs, so an iterable that slices lazily costs nothing on a clean load)."""
    if got.shape == want.shape and torch.equal(got, want):
        return "restored"
    if not got.any() and want.any():
        return "placeholder-zero"
    if not torch.isfinite(got).all() and torch.isfinite(want).all():
        return "non-finite"
    if any(s.shape == got.shape and torch.equal(got, s) for s in siblings):
        return "another-expert"
    return "differs"


def _expert_group(key: str) -> tuple[str, str] | None:
    """(layer and linear before the expert index, after it) of a per-expert amax key."""
    m = PER_EXPERT_WEIGHT_AMAX.match(key)
    return (key[:m.start("expert")], key[m.end("expert"):]) if m else None


def _sibling_index(reference: dict[str, torch.Tensor]) -> dict[tuple[str, str], list[str]]:
    """Every per-expert amax key of the reference, grouped by layer and linear (built once per
    comparison: a load rank compares thousands of such keys at the jobs' shapes)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for k in reference:
        group = _expert_group(k)
        if group:
            groups.setdefault(group, []).append(k)
    return groups


def compare(sharded_sd, reference: dict[str, torch.Tensor]) -> Comparison:
    out = Comparison()
    groups = _sibling_index(reference)
    for sh in _sharded_tensors(sharded_sd):
        out.present_keys.append(sh.key)
        ref = reference.get(sh.key)
        if ref is None:
            out.unexpected_keys.append(sh.key)
            continue
        got, want = _local_view(sh), ref[_slices(sh)]
        out.keys_compared += 1
        if is_expert_weight_amax(sh.key):
            out.expert_amax_compared += 1
            siblings = (reference[k][_slices(sh)] for k in groups.get(_expert_group(sh.key), ())
                        if k != sh.key and reference[k].shape == ref.shape)
            state = _amax_state(got, want, siblings)
            prev = out.expert_amax.get(sh.key, "restored")
            out.expert_amax[sh.key] = min(state, prev, key=AMAX_STATES.index)
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            diff = (
                (got.float() - want.float()).abs().max().item()
                if got.shape == want.shape
                else None
            )
            out.mismatches.append(
                {"key": sh.key, "offset": list(sh.global_offset), "max_abs_diff": diff,
                 "got_dtype": str(got.dtype), "want_dtype": str(want.dtype)}
            )
    return out


def missing_keys(reference: dict[str, torch.Tensor], present_on_any_rank: set[str]) -> list[str]:
    return sorted(set(reference) - present_on_any_rank)


def merge(per_rank: list[Comparison], reference: dict[str, torch.Tensor]) -> dict:
    """Every load rank's comparison in one figure set (counts summed over ranks, so a shard
    held by several replicas counts once per holder)."""
    out = Comparison()
    for c in per_rank:
        out.keys_compared += c.keys_compared
        out.expert_amax_compared += c.expert_amax_compared
        out.mismatches += c.mismatches
        out.unexpected_keys += [k for k in c.unexpected_keys if k not in out.unexpected_keys]
    figures = out.as_dict()
    figures["ranks_compared"] = len(per_rank)
    figures["missing_keys"] = missing_keys(reference, {k for c in per_rank for k in c.present_keys})
    figures["expert_amax_state"] = expert_amax_state(per_rank, reference, figures["missing_keys"])
    return figures


def expert_amax_state(per_rank: list[Comparison], reference, missing: list[str]) -> dict:
    """Per saved expert amax key, what the loaded model holds (worst over its holders): counts
    per AMAX_STATES entry and up to 8 example keys of each state but ``restored``."""
    worst: dict[str, str] = {k: "absent" for k in missing if is_expert_weight_amax(k)}
    for c in per_rank:
        for k, state in c.expert_amax.items():
            worst[k] = min(state, worst.get(k, "restored"), key=AMAX_STATES.index)
    counts = {state: sum(v == state for v in worst.values()) for state in AMAX_STATES}
    examples = {state: sorted(k for k, v in worst.items() if v == state)[:8]
                for state in AMAX_STATES if state != "restored" and counts[state]}
    return {"saved": sum(is_expert_weight_amax(k) for k in reference), **counts, "examples": examples}


def restore_from_reference(sharded_sd, reference: dict[str, torch.Tensor]) -> int:
    """Write the reference's value into every local tensor that differs from it (in place, so
    the model uses it); returns how many were written. For measuring what the differences do."""
    written = 0
    for sh in _sharded_tensors(sharded_sd):
        ref = reference.get(sh.key)
        if ref is None:
            continue
        want = ref[_slices(sh)]
        if torch.equal(_local_view(sh), want):
            continue
        with torch.no_grad():
            sh.data.copy_(want.reshape(sh.data.shape).to(sh.data.dtype))
        written += 1
    return written
