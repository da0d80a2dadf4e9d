"""Back-compat loading of older MoE checkpoints into per-expert (0.47.0) weight quantizers.

Two kinds of checkpoint lack some ``...experts.experts.{e}.<linear>.weight_quantizer._amax``
that a 0.47.0 TEGroupedMLP model asks for:

* the ModelOpt <= 0.46.x layout: ONE shared ``...experts.experts.<linear>.weight_quantizer._amax``
  per grouped linear, and one shared ``weight_quantizer`` entry in each grouped linear's
  ``_extra_state``. Documented behaviour here: every expert takes the shared value, which is
  exactly what 0.46.x itself used for all experts of the grouped linear.
* 0.47.0 checkpoints saved at TP != ETP with sharding validation off: experts whose amax had no
  main replica were never written. Their amax is re-derived from the loaded expert weight by max
  calibration (``max|W|`` over the whole expert, i.e. reduced over the expert TP group), which is
  what ModelOpt's max calibration of an NVFP4 weight quantizer stores; a warning names them.

(d) ``legacy_extra_state``: before 0.47.0's ``quant_module_set_extra_state`` runs, a legacy
    shared ``weight_quantizer`` state is copied to every ``weight_quantizer.{i}`` of a
    ``GroupedQuantizer``, so each expert's quantizer gets its config and an ``_amax`` buffer
    (0.47.0's own fallback only maps ``weight_quantizer.{i}`` to ``weight_quantizer.0``).
(e) ``wrap_dist_load``: ``megatron.core.dist_checkpointing.load`` drops per-expert amax requests
    the checkpoint does not hold (unpatched they end in a DCP "Missing key" error), loads the
    rest, then fills them in as above. Requests for keys the checkpoint has are untouched, so a
    complete checkpoint loads exactly as before.
"""
from __future__ import annotations

import functools
import re
import warnings

_MARK = "__moe_ckpt_fix__"
# "<prefix>.experts.experts.<e>.<linear>.weight_quantizer._amax"
_EXPERT_AMAX = re.compile(
    r"^(?P<prefix>.*\.experts\.experts)\.(?P<expert>\d+)\.(?P<linear>[^.]+)\.weight_quantizer\._amax$"
)


class LegacyCheckpointError(RuntimeError):
    """An older checkpoint's quantizer state cannot be mapped onto this model (message says why)."""


class LegacyCheckpointWarning(UserWarning):
    """An expert's amax did not come from its own checkpoint entry (the message names experts)."""


# --- (d) legacy shared weight_quantizer state -> every expert -------------------------------------
def legacy_grouped_state(module, state):
    """``state`` with the legacy shared ``weight_quantizer`` entry copied to each expert's name."""
    from modelopt.torch.quantization.nn import GroupedQuantizer

    wq = getattr(module, "weight_quantizer", None)
    qstate = state.get("modelopt_quantizer_state") if isinstance(state, dict) else None
    if not isinstance(wq, GroupedQuantizer) or not qstate or "weight_quantizer" not in qstate:
        return state
    if any(k.startswith("weight_quantizer.") for k in qstate):
        return state  # already per-expert (0.47.0 layout)
    shared = qstate["weight_quantizer"]
    qstate = {**qstate, **{f"weight_quantizer.{i}": shared for i in range(len(wq))}}
    return {**state, "modelopt_quantizer_state": qstate}


def wrap_set_extra_state(set_extra_state):
    @functools.wraps(set_extra_state)
    def quant_module_set_extra_state(self, state):
        return set_extra_state(self, legacy_grouped_state(self, state))

    setattr(quant_module_set_extra_state, _MARK, True)
    return quant_module_set_extra_state


# --- (e) dist_checkpointing.load that fills absent per-expert amax -------------------------------
def _walk(tree, path=()):
    """(path, leaf) of every leaf of a nested dict/list sharded state dict."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _walk(v, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _walk(v, path + (i,))
    else:
        yield path, tree


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree, path, value):
    for p in path[:-1]:
        tree = tree.setdefault(p, {}) if isinstance(tree, dict) else tree[p]
    tree[path[-1]] = value


def read_tensor(checkpoint_dir, meta, like):
    """One whole tensor (``meta``: its entry of ``load_tensors_metadata``) from a torch_dist
    checkpoint, read by this rank alone (no collective)."""
    import torch
    import torch.distributed.checkpoint as dcp

    key = meta.key
    out = {key: torch.empty(tuple(meta.global_shape), dtype=meta.dtype)}
    try:
        dcp.load(out, storage_reader=dcp.FileSystemReader(str(checkpoint_dir)), no_dist=True)
    except Exception as exc:  # noqa: BLE001 - re-raised with the key and directory named
        raise LegacyCheckpointError(
            f"could not read {key} from {checkpoint_dir} (only torch_dist checkpoints are "
            f"supported for legacy amax): {exc}") from exc
    return out[key].to(device=like.device, dtype=like.dtype)


def _expert_weight_max(weight, like):
    """max|W| of the whole expert: this rank's shard, reduced over the expert TP group."""
    import megatron.core.parallel_state as mpu
    import torch

    amax = weight.detach().abs().amax().to(torch.float32).reshape(1).to(weight.device)

    if torch.distributed.is_initialized() and mpu.model_parallel_is_initialized():
        group = mpu.get_expert_tensor_parallel_group(check_initialized=False)
        if group is not None and torch.distributed.get_world_size(group) > 1:
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=group)
    return amax.to(like.dtype).reshape(like.shape).to(like.device)


def _plan(sharded_state_dict, stored):
    """Absent per-expert amax requests: [(path, ShardedTensor, key match, legacy key or None,
    weight path)]. ``stored``: the checkpoint's tensor keys."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    by_key = {}
    leaves = []
    for path, leaf in _walk(sharded_state_dict):
        if isinstance(leaf, ShardedTensor):
            by_key[leaf.key] = path
            leaves.append((path, leaf))
    plan = []
    for path, sh in leaves:
        m = _EXPERT_AMAX.match(sh.key)
        if not m or sh.key in stored or not isinstance(path[-1], str):
            continue
        legacy = f"{m['prefix']}.{m['linear']}.weight_quantizer._amax"
        weight_path = by_key.get(sh.key[: -len("_quantizer._amax")])
        # An underivable entry is still taken out of the request and reported AFTER the
        # collective load (_fill): raising here, on some ranks only, would hang the others.
        plan.append((path, sh, m, legacy if legacy in stored else None, weight_path))
    return plan


def _fill(state, plan, checkpoint_dir, stored, request):
    legacy_cache, legacy_used, derived = {}, {}, {}
    # Sorted by key so ETP peers (same experts, same absent keys) all-reduce in the same order.
    for path, sh, m, legacy, weight_path in sorted(plan, key=lambda p: p[1].key):
        if legacy is not None:
            if legacy not in legacy_cache:
                legacy_cache[legacy] = read_tensor(checkpoint_dir, stored[legacy], sh.data)
            value = legacy_cache[legacy]
            if value.numel() != sh.data.numel():
                raise LegacyCheckpointError(
                    f"legacy {legacy} has shape {tuple(value.shape)}; expert amax {sh.key} needs "
                    f"{tuple(sh.local_shape)} (only per-tensor amax can be shared)")
            value = value.reshape(sh.data.shape).clone()
            legacy_used.setdefault(legacy, []).append(int(m["expert"]))
        else:
            if weight_path is None:
                raise LegacyCheckpointError(
                    f"{sh.key} is neither in {checkpoint_dir} nor derivable: no pre-0.47 shared "
                    "amax and the expert's weight is not loaded on this rank")
            if sh.data.numel() != 1:
                raise LegacyCheckpointError(
                    f"{sh.key} is absent and is not a per-tensor amax (shape "
                    f"{tuple(sh.local_shape)}): cannot re-derive it by max calibration")
            weight = _get(state, weight_path)
            value = _expert_weight_max(weight, sh.data)
            derived.setdefault(f"{m['prefix']}.{m['linear']}", []).append(int(m["expert"]))
        _set(state, path, value)
        _set(request, path, sh)  # give the caller's sharded state dict its entry back
    for legacy, experts in legacy_used.items():
        warnings.warn(
            f"moe-ckpt-fix: {checkpoint_dir} holds the pre-0.47 shared {legacy}; experts "
            f"{sorted(experts)} take that value (what ModelOpt <= 0.46 used for every expert)",
            LegacyCheckpointWarning, stacklevel=3)
    for linear, experts in derived.items():
        warnings.warn(
            f"moe-ckpt-fix: {checkpoint_dir} has no weight-quantizer amax for experts "
            f"{sorted(experts)} of {linear} (saved at TP != ETP without sharding validation?); "
            "re-derived from the loaded weights by max calibration (max|W| per expert)",
            LegacyCheckpointWarning, stacklevel=3)


def wrap_dist_load(load):
    """Wrap ``megatron.core.dist_checkpointing.load`` (see module docstring, (e))."""

    @functools.wraps(load)
    def dist_checkpointing_load(sharded_state_dict, checkpoint_dir, *args, **kwargs):
        from megatron.core.dist_checkpointing import load_tensors_metadata

        stored = load_tensors_metadata(str(checkpoint_dir))  # key -> metadata, read once
        plan = _plan(sharded_state_dict, stored)
        if not plan:
            return load(sharded_state_dict, checkpoint_dir, *args, **kwargs)
        for path, *_ in plan:
            del _get(sharded_state_dict, path[:-1])[path[-1]]
        result = load(sharded_state_dict, checkpoint_dir, *args, **kwargs)
        state = result[0] if isinstance(result, tuple) else result
        _fill(state, plan, checkpoint_dir, stored, sharded_state_dict)
        return result

    setattr(dist_checkpointing_load, _MARK, True)
    return dist_checkpointing_load


def install_dist_load() -> None:
    """Rebind ``load`` where callers look it up: the package (``dist_checkpointing.load``, what
    Megatron-LM and this harness call) and its ``serialization`` module."""
    import megatron.core.dist_checkpointing as dc
    import megatron.core.dist_checkpointing.serialization as ser

    if not getattr(ser.load, _MARK, False):
        ser.load = wrap_dist_load(ser.load)
    dc.load = ser.load
