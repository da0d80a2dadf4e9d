"""(f) Static NVFP4 expert weights across expert TP, in ModelOpt's own checkpoint format.

A static NVFP4 weight quantizer (block type ``static``, e.g. the Nemotron-3 ``nvfp4-4o6`` and
``nvfp4-mse`` recipes) keeps one ``_amax`` per 16-element block of the weight's last axis, shape
``(weight numel / 16, 1)`` in row-major block order, and one scalar ``_global_amax``. A block lies
in ONE row of the weight, so it belongs to the expert-TP shard holding that row (fc1,
column-parallel: rows; with a gated linear unit the local rows are ``[W_r; V_r]`` while the
ETP-1 weight is ``[W; V]``, megatron-core's ``apply_swiglu_sharded_factory``) or those columns
(fc2, row-parallel). ModelOpt 0.47.0 and 0.48.0rc1 declare the local ``(N / ETP, 1)`` split
along axis 0 (fc1) or along its size-1 axis 1 (fc2), which is the right box only for a plain fc1;
restore it with the shape it had at the save; and refuse to calibrate it at expert TP > 1
(``_check_nvfp4_static_tp_supported``). Hence: saved at ETP 1, refused at ETP 2 and 4 ("Global
shape mismatch") or, gated fc1, loaded with the wrong rows; never saved at ETP > 1.

This part of the fix, the same for 0.47.0 and 0.48.0rc1 (their code here is the same), keeps the
checkpoint exactly ModelOpt's ETP-1 one (keys, global shape ``(N, 1)``, block order, dtype), so
every release reads what it writes, and what they wrote:

- ``replicated_whole`` (installed by ``redeclare`` in the grouped linear's
  ``sharded_state_dict``): each per-expert block ``_amax`` becomes a megatron-core
  ``ShardedTensorFactory`` declaring the expert's whole ``(N, 1)`` replicated over expert TP
  (replica id's TP slot = the expert-TP rank: one main replica). Its build gathers the ranks'
  parts over the expert TP group into the ETP-1 order (``gather_whole``: a collective, run when
  megatron-core builds the factories, at the save and the load, by every rank of the group in
  the same module order); its merge cuts the loaded whole to the rank's part (``local_part``).
  A save at ETP 2 writes the bytes a save at ETP 1 of the same weights writes.
- ``fit_block_amax``: after ModelOpt's post-restore, an expert whose block ``_amax`` does not fit
  its local weight (restored with the save's shape) is re-calibrated as ModelOpt itself does on a
  mismatch (``reset_amax`` + weight-only ``max_calibrate``); the checkpoint's values load next.
- ``nvfp4_static_tp_check``: ModelOpt's calibration refusal, less the grouped expert linears
  this part reshards (every block inside one expert-TP shard).
- ``reduce_global_amax``: after a distributed max calibration (before MSE uses it), each
  expert's ``_global_amax`` is the MAX over the expert TP group, the expert's true maximum on
  every rank (it stays a replicated per-expert scalar in the checkpoint).
"""
from __future__ import annotations

import functools
import inspect

from moe_ckpt_fix.block_layout import local_part, whole_from_parts  # noqa: F401  (tests read them here)

MARK = "__moe_ckpt_fix_static_block__"  # on every function this module installs (idempotency)
_ANY_MARK = "__moe_ckpt_fix__"  # the package's common mark (tests look for it)


def _marked(func, *marks):
    for m in (MARK, _ANY_MARK, *marks):
        setattr(func, m, True)
    return func


# --- the facts -------------------------------------------------------------------------------------
def block_length(quantizer) -> int | None:
    """Elements per block of a static block quantizer whose blocks run along the weight's last
    axis only (static NVFP4: ``{-1: 16, type: static}``), else None."""
    if not getattr(quantizer, "is_static_block_quant", False):
        return None
    sizes = quantizer.block_sizes or {}
    axes = {k: v for k, v in sizes.items() if isinstance(k, int) and v}
    return int(axes[-1]) if list(axes) == [-1] else None


def expert_quantizers(module) -> list:
    """The per-expert weight quantizers of a grouped linear (``weight_quantizer[i]``), [] when it
    has no ``GroupedQuantizer``."""
    from modelopt.torch.quantization.nn import GroupedQuantizer

    wq = getattr(module, "weight_quantizer", None)
    return list(wq) if isinstance(wq, GroupedQuantizer) else []


def expert_amax_holders(module) -> list:
    """Every TensorQuantizer under a grouped linear's ``GroupedQuantizer`` (a member, or a
    member's SequentialQuantizer levels) that holds an ``_amax``; [] without one. Parts (b) and
    (g) both act on exactly these."""
    from modelopt.torch.quantization.nn import GroupedQuantizer, TensorQuantizer

    wq = getattr(module, "weight_quantizer", None)
    if not isinstance(wq, GroupedQuantizer):
        return []
    return [q for q in wq.modules()
            if isinstance(q, TensorQuantizer) and getattr(q, "_amax", None) is not None]


def expert_tp_group(module):
    """The expert tensor-parallel group a grouped linear's weights are sharded over:
    ``TEGroupedLinear`` builds them with ``self._tp_group`` (``pg_collection.expt_tp``)."""
    group = getattr(module, "_tp_group", None)
    if group is None and getattr(module, "_pg_collection", None) is not None:
        group = module._pg_collection.expt_tp
    if group is None:
        import megatron.core.parallel_state as mpu

        group = mpu.get_expert_tensor_parallel_group()
    return group


# --- the declaration -------------------------------------------------------------------------------
def fits(amax, weight, block: int) -> bool:
    """Whether ``amax`` holds one value per whole block of the local weight whose ShardedTensor
    is ``weight`` (a plain 2-D box: no flattened range)."""
    rows, cols = weight.local_shape[-2:]
    return (weight.flattened_range is None and len(weight.local_shape) == 2 and cols % block == 0
            and amax.numel() == rows * cols // block)


def gather_whole(local, rows: int, axis: int, halves: int, group):
    """The expert's whole ``(N, 1)`` block amax on every rank of the expert TP ``group`` (an
    all-gather of the local parts: a collective of the group)."""
    import torch
    import torch.distributed as dist
    from megatron.core.utils import get_pg_size

    size = get_pg_size(group)
    if size == 1:
        return whole_from_parts([local.detach()], rows, axis, halves)
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.detach().contiguous(), group=group)
    return whole_from_parts(parts, rows, axis, halves)


def replicated_whole(entry, rows: int, axis: int, halves: int, group):
    """A ShardedTensorFactory standing in for ModelOpt's ShardedTensor ``entry`` of a per-expert
    block amax (key, prefix axes and replica id kept; ``entry.data`` the local ``(N / size, 1)``
    of a local weight with ``rows`` rows): it declares the expert's whole ``(N, 1)`` in ETP-1
    order, replicated over expert TP (replica id's TP slot = the expert-TP rank, so one main
    replica), holding the parts gathered over ``group`` (``gather_whole``, when megatron-core
    builds the factory: at the save and at the load, on every rank of the group in the same
    order); what is loaded is cut to this rank's part (``local_part``)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    from megatron.core.utils import get_pg_rank, get_pg_size

    size, rank = get_pg_size(group), get_pg_rank(group)
    p = entry.prepend_axis_num
    prefix_offsets = tuple((a, entry.global_offset[a], entry.global_shape[a]) for a in range(p))
    rid = entry.replica_id
    replica_id = (rid[0], rank, *rid[2:]) if isinstance(rid, tuple) and len(rid) >= 2 else (rid, rank)

    def build(key, data, factory_replica_id, flattened_range):
        if flattened_range is not None:
            raise NotImplementedError(f"{key}: a flattened block amax is not declared whole")
        whole = gather_whole(data, rows, axis, halves, group)
        return ShardedTensor.from_rank_offsets(key, whole, *prefix_offsets,
                                               replica_id=factory_replica_id, prepend_axis_num=p)

    def merge(loaded):
        return local_part(loaded, rows, axis, halves, rank, size).to(entry.dtype)

    return ShardedTensorFactory(entry.key, entry.data, build, merge, replica_id)


def amax_entry(prefix: str, expert: int) -> str:
    """The sharded-state-dict entry of expert ``expert``'s weight amax in a grouped linear's
    sharded state dict (ModelOpt's dict key; the ShardedTensor key names the global expert)."""
    return f"{prefix}weight_quantizer.{expert}._amax"


def redeclare(sharded_state_dict: dict, prefix: str, quantizers, axis: int, gated: bool,
              group) -> list[int]:
    """In a grouped linear's ``sharded_state_dict`` (entries ``{prefix}weight{i}`` and
    ``{prefix}weight_quantizer.{i}._amax``), replace every static block amax by its
    ``replicated_whole`` (``axis``: 0 column-parallel fc1, 1 row-parallel fc2; ``gated``: fc1 of
    a gated unit, rows ``[W_r; V_r]``); the experts done. Other entries (scalar amax,
    ``_global_amax``, shared quantizers) are left as they are, and so is a block amax that does
    not ``fit`` its weight (padded blocks, a weight sharded over data parallel): ModelOpt's
    declaration, whose calibration check then refuses expert TP > 1 (``reshardable``)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    done = []
    for i, q in enumerate(quantizers):
        block = block_length(q)
        entry = sharded_state_dict.get(amax_entry(prefix, i))
        weight = sharded_state_dict.get(f"{prefix}weight{i}")
        if (block and isinstance(entry, ShardedTensor) and isinstance(weight, ShardedTensor)
                and fits(entry.data, weight, block)):
            halves = 2 if gated and axis == 0 else 1
            sharded_state_dict[amax_entry(prefix, i)] = replicated_whole(
                entry, weight.local_shape[-2], axis, halves, group)
            done.append(i)
    return done


def wrap_linear_sharded_state_dict(sharded_state_dict):
    """A grouped linear's ``sharded_state_dict``, its static block amax declared whole
    (``redeclare``): fc1 (ModelOpt's ``_is_column_parallel``) along rows, gated when its
    ``config.gated_linear_unit`` (megatron-core's own condition in
    ``TEGroupedMLP.sharded_state_dict``), fc2 along columns; over its expert TP group."""

    @functools.wraps(sharded_state_dict)
    def wrapper(self, prefix="", sharded_offsets=(), metadata=None):
        out = sharded_state_dict(self, prefix, sharded_offsets, metadata)
        column = bool(getattr(self, "_is_column_parallel", False))
        redeclare(out, prefix, expert_quantizers(self), 0 if column else 1,
                  column and bool(getattr(self.config, "gated_linear_unit", False)),
                  expert_tp_group(self))
        return out

    return _marked(wrapper)


# --- the restore -----------------------------------------------------------------------------------
def fit_block_amax(module) -> list[int]:
    """Experts of a grouped linear whose static block ``_amax`` does not fit their local weight
    (restored with the shape of the save's expert-TP shard) get one that does, by ModelOpt's own
    remedy for a mismatch (``_QuantTEGroupedLinear.modelopt_post_restore``: ``reset_amax`` then a
    weight-only ``max_calibrate``); their checkpoint values are loaded next. The experts done."""
    from modelopt.torch.quantization.model_calib import max_calibrate

    done = []
    for i, q in enumerate(expert_quantizers(module)):
        weight, block = getattr(module, f"weight{i}", None), block_length(q)
        amax = getattr(q, "_amax", None)
        if weight is None or block is None or amax is None or weight.shape[-1] % block:
            continue
        if amax.numel() == weight.numel() // block:
            continue
        for stale in ("_block_reshape_size", "_original_shape", "_padding", "_slices"):
            if hasattr(q, stale):  # derived from another shape; the next forward sets them again
                delattr(q, stale)
        q.reset_amax()
        max_calibrate(q, lambda wq, w=weight: wq(w), distributed_sync=False)
        done.append(i)
    return done


def wrap_post_restore(post_restore):
    @functools.wraps(post_restore)
    def modelopt_post_restore(self, prefix: str = ""):
        post_restore(self, prefix=prefix)
        fit_block_amax(self)

    return _marked(modelopt_post_restore)


# --- the calibration -------------------------------------------------------------------------------
def reshardable(module, grouped_cls) -> bool:
    """A grouped expert linear whose static block amax this part shards like the weight: every
    static block expert quantizer's local weight holds whole blocks (cols % block == 0)."""
    if not isinstance(module, grouped_cls):
        return False
    for i, q in enumerate(expert_quantizers(module)):
        if getattr(q, "is_nvfp4_static", False):
            block, weight = block_length(q), getattr(module, f"weight{i}", None)
            if block is None or weight is None or weight.shape[-1] % block:
                return False
    return True


def nvfp4_static_tp_check(grouped_cls):
    """ModelOpt's ``_check_nvfp4_static_tp_supported`` (0.47.0 plugins/megatron.py:86-115,
    0.48.0rc1 the same), minus the grouped expert linears that are ``reshardable``: their block
    amax is sharded like the weight and their global amax reduced over the expert TP group."""
    from modelopt.torch.quantization.nn import GroupedQuantizer, QuantModule, SequentialQuantizer

    def _check_nvfp4_static_tp_supported(model) -> None:
        offending = []
        for name, module in model.named_modules():
            if not isinstance(module, QuantModule) or reshardable(module, grouped_cls):
                continue
            parallel_state = getattr(module, "parallel_state", None)
            tp_group = getattr(parallel_state, "tensor_parallel_group", None)
            if tp_group is None or not tp_group.is_initialized() or tp_group.world_size() <= 1:
                continue
            wq = getattr(module, "weight_quantizer", None)
            if wq is None:
                continue
            leaves = list(wq) if isinstance(wq, (SequentialQuantizer, GroupedQuantizer)) else [wq]
            if any(leaf.is_nvfp4_static for leaf in leaves):
                offending.append((name, tp_group.world_size()))
        if offending:
            raise NotImplementedError(
                "Static-block NVFP4 weight quantization (e.g. MSE) is not supported with TP > 1 "
                "outside grouped MoE experts (moe_ckpt_fix reshards those). Please re-run with "
                f"TP=1. Offending modules (showing first 5 of {len(offending)}): {offending[:5]}")

    return _marked(_check_nvfp4_static_tp_supported)


def reduce_global_amax(model, grouped_cls) -> int:
    """Every static NVFP4 expert quantizer's ``_global_amax`` of every grouped expert linear
    becomes the MAX over its expert TP group (one all-reduce per linear, in module order, which
    is the same on every rank of the group); the number of quantizers reduced."""
    import torch
    import torch.distributed as dist

    count = 0
    for module in model.modules():
        if not isinstance(module, grouped_cls):
            continue
        group = expert_tp_group(module)
        if group is None or dist.get_world_size(group) <= 1:
            continue
        qs = [q for q in expert_quantizers(module)
              if block_length(q) and getattr(q, "_global_amax", None) is not None]
        if not qs:
            continue
        values = torch.stack([q._global_amax.detach().float().reshape(()) for q in qs])
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
        for q, v in zip(qs, values):
            q._global_amax.copy_(v.to(q._global_amax.dtype).reshape(q._global_amax.shape))  # in place: may be tied
        count += len(qs)
    return count


def wrap_max_calibrate(max_calibrate, grouped_cls):
    """``max_calibrate`` that, when it synced across ranks (``distributed_sync``), ends with
    ``reduce_global_amax``: MSE (``mse_calibrate``) then searches each block against the
    expert's true global amax, as it would at ETP 1."""
    sig = inspect.signature(max_calibrate)

    @functools.wraps(max_calibrate)
    def wrapper(*args, **kwargs):
        import torch.distributed as dist

        out = max_calibrate(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("distributed_sync") and dist.is_available() and dist.is_initialized():
            reduce_global_amax(bound.arguments["model"], grouped_cls)
        return out

    return _marked(wrapper)


# --- apply -----------------------------------------------------------------------------------------
DESCRIPTION = ("(f) static NVFP4 expert block _amax saved whole in ModelOpt's (N, 1) ETP-1 layout "
               "at any expert TP (gathered over the expert TP group, one main replica) and cut "
               "to the rank's rows (fc1, gated halves as megatron-core lays out the weight) or "
               "columns (fc2) at the load, refitted after restore, calibrated at expert TP > 1 "
               "with _global_amax the max over the expert TP group")


def calls_finalize(calibrate) -> bool:
    """Whether ModelOpt's ``max_calibrate`` calls ``_finalize_with_shared_state`` (where the
    global amax is set), read through its decorators: 0.47.0's is wrapped (torch.no_grad), and
    the wrapper's own code names nothing of it (seen on the H100, 2026-12-06: part (f) refused
    to install on the real stack while every cpu test passed)."""
    import inspect

    return "_finalize_with_shared_state" in inspect.unwrap(calibrate).__code__.co_names


def prepare(mp):
    """Check ModelOpt's megatron plugin ``mp`` (0.47.0 or 0.48.0rc1) and its calibration and
    return the function that installs (f) (and returns ``DESCRIPTION``): a refusal comes here,
    before the caller installs anything, so it leaves ModelOpt untouched. The caller has checked
    the version and that the TE classes exist."""
    import modelopt.torch.quantization.mode as mode
    import modelopt.torch.quantization.model_calib as model_calib

    from moe_ckpt_fix.parts import Refused

    grouped = mp._QuantMegatronTEGroupedLinear
    calibrate = model_calib.max_calibrate
    if not getattr(calibrate, MARK, False) and not calls_finalize(calibrate):
        raise Refused("moe_ckpt_fix: max_calibrate does not call _finalize_with_shared_state (where "
                      "the global amax is set); not the source this fix was written for. Nothing "
                      "was patched.")
    targets = [
        (grouped, "sharded_state_dict", wrap_linear_sharded_state_dict),
        (grouped, "modelopt_post_restore", wrap_post_restore),
        (model_calib, "max_calibrate", lambda f: wrap_max_calibrate(f, grouped)),
        (mode.MaxCalibrateModeDescriptor, "_calib_func", lambda f: wrap_max_calibrate(f, grouped)),
        (mp, "_check_nvfp4_static_tp_supported", lambda f: nvfp4_static_tp_check(grouped)),
    ]

    def install() -> str:
        """Wrap what is there now (after the caller's own wrappers of the same methods)."""
        for owner, name, wrap in targets:
            current = getattr(owner, name)
            if not getattr(current, MARK, False):
                setattr(owner, name, wrap(current))
        return DESCRIPTION

    return install
