"""Rank program: static NVFP4 expert block amax saved at one expert TP, loaded at another (4 gloo ranks).

The cpu tier has no Transformer Engine, so no ``TEGroupedMLP``. Its sharded state dict is built
here the way megatron-core and ModelOpt build it, with their own functions:
- the expert weights as ``TEGroupedLinear._sharded_state_dict_grouped`` builds them
  (``make_sharded_tensors_for_checkpoint`` with the expert TP group, the axis of the linear, the
  expert-DP replica rewrite), fc1 of a gated MLP wrapped by ``apply_swiglu_sharded_factory`` as
  ``TEGroupedMLP.sharded_state_dict`` does, keys prefixed per global expert
  (``singleton_local_shards``, what ModelOpt's ``_MegatronMLP`` forces);
- the per-expert ``weight_quantizer.{i}._amax`` / ``._global_amax`` as ModelOpt 0.47.0 with
  ``moe_ckpt_fix`` part (a) builds them (native ``(N, 1)`` shape, fc1 axis 0, fc2 axis 1 by
  ``_get_shard_axis_dict``, expert TP/DP groups); then, ``fixed``, part (f)'s ``redeclare`` (the
  fix's own function, on real ModelOpt static NVFP4 ``TensorQuantizer``s and the real expert-TP
  process group it gathers over), as the fix's wrapper of the grouped linear calls it.
A rank's local weight is its rows (fc1, ``[W_r; V_r]`` when gated) or columns (fc2) of a known
full weight; its block amax is computed on that local shard (as calibration at expert TP > 1
does); its ``_global_amax`` is the local max reduced by the fix's ``reduce_global_amax`` over a
real expert-TP process group. Each case saves with megatron-core's torch_dist writer (sharding
validation on) and loads at another topology with megatron-core's own ``dist_checkpointing.load``
(the fix declaring the request, or not: ModelOpt's own declaration, an unpatched load). Every rank
writes what it loaded (``torch.save``), rank 0 each checkpoint's stored tensors whole
(``load_plain_tensors``, every rank reading) and their metadata; the test computes what they must
be from the full weights and the rank's coordinates.

Usage: python -m tests.rank_programs.static_block_reshard <out_dir>   (4 ranks under run_stage)
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from harness.rank.guard import pg_timeout_s, rank_main

BLOCK = 16
HIDDEN, FFN, EXPERTS = 64, 64, 4
# (MLP prefix, gated): fc1 of layer 0 is a gated linear unit ([W; V] rows), layer 1 is not
LAYERS = (("decoder.layers.0.mlp.", True), ("decoder.layers.1.mlp.", False))
LINEARS = ("linear_fc1", "linear_fc2")
WORLD = 4
# (name, save topology, load topology): ETP 1 -> 2 and 4, 2 -> 1 and 4, with TP and EP changes
CASES = (
    ("etp1-to-etp2", "tp1-etp1-ep4", "tp2-etp2-ep2"),
    ("etp1-to-etp4", "tp2-etp1-ep4", "tp4-etp4-ep1"),
    ("etp2-to-etp1", "tp2-etp2-ep2", "tp1-etp1-ep4"),
    ("etp2-to-etp4", "tp2-etp2-ep1-pp1-w4", "tp4-etp4-ep1"),
)


class Group:
    """Stands in for a ProcessGroup where megatron-core only asks rank() and size()."""

    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def full_weight(layer: int, linear: str, expert: int) -> torch.Tensor:
    """The expert's whole weight: fc1 (2*FFN or FFN, HIDDEN), fc2 (HIDDEN, FFN). Every |value| is
    distinct (a permutation), so every block has its own maximum and a misplaced block shows."""
    gated = LAYERS[layer][1]
    shape = ((2 * FFN if gated else FFN), HIDDEN) if linear == "linear_fc1" else (HIDDEN, FFN)
    gen = torch.Generator().manual_seed(1000 * layer + 100 * LINEARS.index(linear) + expert)
    n = shape[0] * shape[1]
    values = (torch.randperm(n, generator=gen).float() + 1) / n
    signs = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
    return (values * signs).reshape(shape)


def local_weight(layer: int, linear: str, expert: int, etp_rank: int, etp: int) -> torch.Tensor:
    """The rank's shard of the expert weight, as megatron-core shards it over expert TP: fc1 its
    rows ([W_r; V_r] of a gated unit: the r-th row block of each half), fc2 its columns."""
    w = full_weight(layer, linear, expert)
    if linear == "linear_fc2":
        n = w.shape[1] // etp
        return w[:, etp_rank * n:(etp_rank + 1) * n].clone()
    if not LAYERS[layer][1]:
        n = w.shape[0] // etp
        return w[etp_rank * n:(etp_rank + 1) * n].clone()
    half = w.shape[0] // 2
    n = half // etp
    return torch.cat([w[etp_rank * n:(etp_rank + 1) * n], w[half + etp_rank * n:half + (etp_rank + 1) * n]])


def block_amax(weight: torch.Tensor) -> torch.Tensor:
    """Per-block max|w| of a weight, shape (numel / BLOCK, 1): what max calibration of a static
    NVFP4 weight quantizer stores (blocks of BLOCK along the last axis, row-major)."""
    return weight.abs().reshape(-1, BLOCK).amax(dim=1, keepdim=True)


def static_nvfp4_quantizer():
    """A real ModelOpt TensorQuantizer with the recipes' static NVFP4 weight attributes."""
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    return TensorQuantizer(QuantizerAttributeConfig(
        num_bits=(2, 1), block_sizes={-1: BLOCK, "type": "static", "scale_bits": (4, 3)}))


def grouped_quantizers(num: int):
    from modelopt.torch.quantization.nn import GroupedQuantizer

    return GroupedQuantizer(*(static_nvfp4_quantizer() for _ in range(num)))


def layer_state(c, topo, layer: int, fixed: bool, data: bool, global_amax=None, group=None) -> dict:
    """One MoE layer's sharded state dict on the rank with coordinates ``c`` (harness RankCoords)
    at ``topo``: expert weights, block ``_amax`` and ``_global_amax`` (see module docstring).
    ``data`` False: zeros (a load request). ``global_amax``: {(layer, linear, expert): (1,)}.
    ``group``: the rank's real expert-TP process group (``fixed``: the fix gathers over it)."""
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    from moe_ckpt_fix import static_block

    prefix, gated = LAYERS[layer]
    local_experts = EXPERTS // topo.ep
    etp, edp, dense_dp = Group(c.etp, topo.etp), Group(c.edp, topo.edp), Group(c.dp, topo.dp)
    mlp_sd = {}
    for linear in LINEARS:
        axis = 0 if linear == "linear_fc1" else 1
        sub = {}
        quantizers = grouped_quantizers(local_experts)
        for i in range(local_experts):
            g = c.ep * local_experts + i
            w = local_weight(layer, linear, g, c.etp, topo.etp)
            amax = block_amax(w)
            if not data:
                w, amax = torch.zeros_like(w), torch.zeros_like(amax)
            # TEGroupedLinear._sharded_state_dict_grouped
            wsd = make_sharded_tensors_for_checkpoint({f"{i}.weight": w}, "", {f"{i}.weight": axis}, (),
                                                      tp_group=etp, dp_cp_group=dense_dp)
            replace_prefix_for_sharding(wsd, f"{i}.", f"{g}.{linear}.")
            sh = wsd[f"{i}.weight"]
            sh.replica_id = (*sh.replica_id[:2], c.edp)
            sub[f"{linear}.weight{i}"] = sh
            # ModelOpt 0.47.0 + fix (a): per-expert subs on the expert groups, axis of the linear
            state = {f"{i}.weight_quantizer._amax": amax}
            if global_amax is not None:
                ga = global_amax[(layer, linear, g)] if data else torch.zeros(1)
                state[f"{i}.weight_quantizer._global_amax"] = ga
            qsd = make_sharded_tensors_for_checkpoint(state, "", {f"{i}.weight_quantizer._amax": axis}, (),
                                                      tp_group=etp, dp_cp_group=edp)
            replace_prefix_for_sharding(qsd, f"{i}.", f"{g}.{linear}.")
            for k, v in qsd.items():
                v.replica_id = (*v.replica_id[:2], c.edp)
                sub[f"{linear}.{k.replace(f'{i}.weight_quantizer', f'weight_quantizer.{i}')}"] = v
        if fixed:  # the fix's grouped-linear wrapper: fc1 along rows (gated: [W_r; V_r]), fc2 columns
            assert static_block.redeclare(sub, f"{linear}.", quantizers, axis, gated and axis == 0,
                                          group) == list(range(local_experts))
        if linear == "linear_fc1" and gated:  # TEGroupedMLP.sharded_state_dict, singleton shards
            for i in range(local_experts):
                sub[f"{linear}.weight{i}"] = apply_swiglu_sharded_factory(
                    sub[f"{linear}.weight{i}"], (), True, tp_group=etp, dp_group=dense_dp)
        replace_prefix_for_sharding(sub, "", f"{prefix}experts.experts.")
        mlp_sd.update({f"{prefix}{k}": v for k, v in sub.items()})
    return mlp_sd


def model_state(c, topo, fixed: bool, data: bool, global_amax=None, group=None) -> dict:
    sd = {}
    for layer in range(len(LAYERS)):
        sd.update(layer_state(c, topo, layer, fixed, data, global_amax, group))
    return sd


# --- the ranks ---------------------------------------------------------------------------------
def _coords(topo_id: str):
    from harness.topology.coords import rank_coords
    from harness.topology.topology import Topology

    topo = Topology.parse(topo_id)
    assert topo.world_size == dist.get_world_size() == WORLD, topo_id
    return topo, rank_coords(topo)[dist.get_rank()]


def _etp_groups(topo_id: str):
    """This rank's real expert-TP process group at ``topo_id`` (every rank creates every group)."""
    from harness.topology.coords import rank_coords
    from harness.topology.topology import Topology

    topo = Topology.parse(topo_id)
    coords = rank_coords(topo)
    mine = None
    for key in sorted({(c.pp, c.ep, c.edp) for c in coords}):
        ranks = [c.rank for c in coords if (c.pp, c.ep, c.edp) == key]
        group = dist.new_group(ranks, backend="gloo")
        if dist.get_rank() in ranks:
            mine = group
    return mine


class ToyGroupedLinear(torch.nn.Module):
    """What ``reduce_global_amax`` reads of a grouped linear: ``_tp_group``, ``weight_quantizer``."""

    def __init__(self, tp_group, quantizers):
        super().__init__()
        self._tp_group, self.weight_quantizer = tp_group, quantizers


def reduced_global_amax(c, topo, group) -> dict:
    """{(layer, linear, global expert): _global_amax} after the fix's reduce over the expert TP
    group, starting from each rank's local max|w| (what promotion gives at ETP > 1)."""
    from moe_ckpt_fix import static_block

    local_experts = EXPERTS // topo.ep
    model, out = torch.nn.Module(), {}
    for layer in range(len(LAYERS)):
        for linear in LINEARS:
            qs = grouped_quantizers(local_experts)
            for i, q in enumerate(qs):
                g = c.ep * local_experts + i
                local = local_weight(layer, linear, g, c.etp, topo.etp)
                q.register_buffer("_global_amax", local.abs().amax().reshape(1))
                out[(layer, linear, g)] = q._global_amax
            model.add_module(f"l{layer}_{linear}", ToyGroupedLinear(group, qs))
    reduced = static_block.reduce_global_amax(model, ToyGroupedLinear)
    assert reduced == (len(LAYERS) * len(LINEARS) * local_experts if topo.etp > 1 else 0), reduced
    return out


def _load(ckpt: Path, topo_id: str, fixed: bool, group=None, keys=None, global_amax: bool = False) -> dict:
    """What megatron-core's ``dist_checkpointing.load`` gives this rank at ``topo_id``, the
    request declared with the fix (``fixed``, over the expert-TP ``group``) or as ModelOpt does."""
    from megatron.core import dist_checkpointing

    topo, c = _coords(topo_id)
    request = model_state(c, topo, fixed, data=False, global_amax={} if global_amax else None,
                          group=group)
    if keys is not None:  # sharded-state-dict entries (dict keys) naming one of ``keys``
        request = {k: v for k, v in request.items() if any(s in k for s in keys)}
    try:
        state = dist_checkpointing.load(request, str(ckpt))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        text = str(exc)
        return {"error": f"{type(exc).__name__}: {text[:300]} ... {text[-300:]}"}
    return {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


MODELOPT = "modelopt-etp1"  # ModelOpt's own declaration saved at ETP 1: every static checkpoint so far
UNPATCHED_ETP1 = "tp1-etp1-ep4"  # where an unpatched job reads any of them


def _stored(ckpt: Path) -> dict:
    """{ShardedTensor key: (global shape, dtype, whole tensor)} of a checkpoint (every rank reads)."""
    from megatron.core import dist_checkpointing

    meta = dist_checkpointing.load_tensors_metadata(str(ckpt))
    plain = dist_checkpointing.load_plain_tensors(str(ckpt))
    return {k: (tuple(m.global_shape), m.dtype, plain[k].clone()) for k, m in meta.items()}


def body() -> dict:
    from harness.model.cpu_shims import apply_cpu_shims

    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s()))
    apply_cpu_shims()
    from megatron.core import dist_checkpointing

    rank = dist.get_rank()
    out = Path(sys.argv[1])
    if rank == 0:
        for name in [n for n, _, _ in CASES] + [MODELOPT]:
            (out / name).mkdir(parents=True, exist_ok=True)
    dist.barrier()
    results = {}
    groups = {t: _etp_groups(t) for t in sorted({t for _, s, l in CASES for t in (s, l)})}
    for name, save_topo, load_topo in CASES:
        ckpt = out / name
        topo, c = _coords(save_topo)
        global_amax = reduced_global_amax(c, topo, groups[save_topo])
        dist_checkpointing.save(model_state(c, topo, True, True, global_amax, groups[save_topo]),
                                str(ckpt), validate_access_integrity=True)
        loaded = {"fixed": _load(ckpt, load_topo, True, groups[load_topo], global_amax=True),
                  # an unpatched job (ModelOpt's declaration, no fix) at ETP 1
                  "unpatched_etp1": _load(ckpt, UNPATCHED_ETP1, False, global_amax=True),
                  "saved_global_amax": {"/".join(map(str, k)): v for k, v in global_amax.items()}}
        torch.save(loaded, out / f"{name}.rank{rank}.pt")
        results[name] = {k: v.get("error") for k, v in loaded.items() if k != "saved_global_amax"}
    # ModelOpt's own declaration, saved at ETP 1 (what every static NVFP4 checkpoint so far is)
    legacy = out / MODELOPT
    topo, c = _coords(UNPATCHED_ETP1)
    dist_checkpointing.save(model_state(c, topo, False, True, reduced_global_amax(c, topo, groups[UNPATCHED_ETP1])),
                            str(legacy), validate_access_integrity=True)
    loaded = {
        "fixed": _load(legacy, "tp2-etp2-ep2", True, groups["tp2-etp2-ep2"], global_amax=True),
        "fixed_etp4": _load(legacy, "tp4-etp4-ep1", True, groups["tp4-etp4-ep1"], global_amax=True),
        # unpatched: the same declaration as the save, at ETP 2 (fc2; gated fc1 alone)
        "unpatched_fc2": _load(legacy, "tp2-etp2-ep2", False, keys=["linear_fc2"]),
        "unpatched_gated_fc1": _load(legacy, "tp2-etp2-ep2", False, keys=["layers.0.mlp.linear_fc1."]),
    }
    torch.save(loaded, out / f"{MODELOPT}.rank{rank}.pt")
    results[MODELOPT] = {k: v.get("error") for k, v in loaded.items()}
    # what each checkpoint stores, whole: the format the fix writes against ModelOpt's
    stored = {name: _stored(out / name) for name in [n for n, _, _ in CASES] + [MODELOPT]}
    if rank == 0:
        torch.save(stored, out / "stored.pt")
    dist.barrier()
    return {"cases": results}


def main() -> None:
    rank_main(os.environ.get("HARNESS_STAGE", "static-block-reshard"), body)


if __name__ == "__main__":
    main()
