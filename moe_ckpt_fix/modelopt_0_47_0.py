"""The fix itself, for nvidia-modelopt 0.47.0 + megatron-core (TEGroupedMLP, per-expert quantizers).

Three changes, each the smallest wrapper around the 0.47.0 method that has the defect (root
cause: docs/findings.md in this repository; same change as a source diff:
patches/nvidia-modelopt-0.47.0-expert-amax-resharding.diff):

a. ``_QuantMegatronTEGroupedLinear.sharded_state_dict`` built the per-expert
   ``weight_quantizer.{i}.*`` ShardedTensors with the DENSE tensor-parallel group (replica_id
   ``(0, tp_rank, edp_rank)``), while Megatron's own expert weights use the EXPERT tensor-parallel
   group. With TP != ETP an expert then has 0 or >1 main replicas and megatron-core's
   ``validate_sharding_integrity`` rejects the save or load. Fixed by giving exactly those calls
   the expert TP group and the expert DP group (replica_id ``(0, etp_rank, edp_rank)``;
   channel/block-shaped amax sharded over ETP along the same axis as before). Shared buffers
   (``input_quantizer._amax``, ...) keep the dense groups; keys, shapes, offsets are unchanged.
b. ``_ParallelLinear.modelopt_post_restore`` (reached from the grouped linear's ``_extra_state``
   during ``load_state_dict``) calls ``weight_quantizer.reset_amax()``, which on a
   ``GroupedQuantizer`` deletes every expert's ``_amax``, then re-calibrates through
   ``GroupedQuantizer.forward``, which only reaches expert 0. Experts >= 1 lose their ``_amax``
   buffer, so the checkpoint's values for them become "unexpected keys" (strict load raises,
   non-strict load silently drops them). Fixed by putting back the ``_amax`` of every group
   member that the reset removed and the re-calibration did not recreate; the grouped linear's
   own per-expert shape check (``_QuantTEGroupedLinear.modelopt_post_restore``) then runs on all
   experts as intended, and the following state-dict load fills in the checkpoint's values.
c. ``_MegatronRowParallelLinear._get_shard_axis_dict`` only resolved ``weight_quantizer.0``/``.1``;
   it now resolves the quantizer of every key, so experts >= 2 with block-shaped static amax are
   TP-sharded like expert 0.
d., e. back-compat loading of older checkpoints (ModelOpt <= 0.46 shared weight-quantizer
   amax; 0.47.0 checkpoints with experts' amax missing): moe_ckpt_fix/legacy_load.py. These
   are runtime-only (e wraps megatron-core's ``dist_checkpointing.load``); the upstream diff
   under patches/ carries a-c.
f. static NVFP4 expert weights across expert TP (the block ``_amax`` saved whole in ModelOpt's
   ETP-1 format and cut to the rank's part at the load, calibration at expert TP > 1): moe_ckpt_fix/static_block.py, shared with 0.48.0rc1; its
   upstream diff is patches/nvidia-modelopt-0.47.0-static-block-expert-tp.diff.
g. the grouped post-restore's dry run on expert amax not loaded yet: moe_ckpt_fix/unloaded_amax.py
   (runtime only, shared with 0.48.0rc1).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import re

from moe_ckpt_fix import legacy_load, static_block, unloaded_amax
from moe_ckpt_fix.parts import (EXPERT_AMAX_PART, STATIC_BLOCK_PART, UNLOADED_AMAX_PART, Refused,
                                TransformerEngineMissing, wanted)

_MARK = "__moe_ckpt_fix__"  # set on every function this module installs (idempotency)
# Keys of the per-expert state dicts that (a) targets: "{gemm_idx}.weight_quantizer.{sub}".
_PER_EXPERT_KEY = re.compile(r"^\d+\.weight_quantizer\.")
# (expert TP group, expert DP group) of the grouped linear whose sharded_state_dict is running.
_expert_groups: contextvars.ContextVar = contextvars.ContextVar("moe_ckpt_fix_groups", default=None)

_applied: str | None = None
_parts: tuple[str, ...] = ()  # what the first apply() installed (parts() names them)


def parts() -> tuple[str, ...]:
    """The parts installed in this process, by the package's names (moe_ckpt_fix.applied_parts)."""
    return _parts


# --- (a) per-expert sharded entries on the expert groups ------------------------------------------
def expert_tp_dp_groups(module) -> tuple:
    """The (expert TP, expert DP) groups Megatron uses for this grouped linear's own weights.

    ``TEGroupedLinear._sharded_state_dict_grouped`` builds expert weights with ``self._tp_group``
    (``pg_collection.expt_tp``) and rewrites the DP part of replica_id to ``pg_collection.expt_dp``.
    ``metadata['dp_cp_group']`` is the DENSE DP group, so it is not used here.
    """
    _, edp = module._expert_parallel_groups()  # modelopt's own (ep, expt_dp) lookup
    return static_block.expert_tp_group(module), edp


@contextlib.contextmanager
def expert_groups_scope(etp_group, edp_group):
    """While active, per-expert quantizer entries are built on these groups (see below)."""
    token = _expert_groups.set((etp_group, edp_group))
    try:
        yield
    finally:
        _expert_groups.reset(token)


def wrap_make_sharded_tensors(make):
    """Wrap megatron's ``make_sharded_tensors_for_checkpoint`` as seen by modelopt's plugin.

    Inside ``expert_groups_scope`` (i.e. inside a grouped linear's ``sharded_state_dict``), a call
    whose keys are all per-expert ``{i}.weight_quantizer.*`` and that names no group gets the
    expert TP/DP groups; every other call (shared quantizer buffers, other modules) is passed
    through untouched.
    """
    sig = inspect.signature(make)

    @functools.wraps(make)
    def make_sharded_tensors_for_checkpoint(*args, **kwargs):
        groups = _expert_groups.get()
        if groups is not None:
            bound = sig.bind(*args, **kwargs)
            arguments = bound.arguments
            state_dict = arguments.get("state_dict") or {}
            if (
                state_dict
                and all(_PER_EXPERT_KEY.match(k) for k in state_dict)
                and arguments.get("tp_group") is None
                and arguments.get("dp_cp_group") is None
            ):
                arguments["tp_group"], arguments["dp_cp_group"] = groups
                return make(*bound.args, **bound.kwargs)
        return make(*args, **kwargs)

    setattr(make_sharded_tensors_for_checkpoint, _MARK, True)
    return make_sharded_tensors_for_checkpoint


def wrap_grouped_sharded_state_dict(sharded_state_dict):
    """Run the 0.47.0 method with this module's expert groups in scope (see ``wrap_make...``)."""

    @functools.wraps(sharded_state_dict)
    def wrapper(self, prefix="", sharded_offsets=(), metadata=None):
        with expert_groups_scope(*expert_tp_dp_groups(self)):
            return sharded_state_dict(self, prefix, sharded_offsets, metadata)

    setattr(wrapper, _MARK, True)
    return wrapper


# --- (b) keep per-expert amax through modelopt_post_restore ---------------------------------------
def wrap_post_restore(post_restore):
    """Keep every GroupedQuantizer member's ``_amax`` that the reset + expert-0 re-calibration drops.

    Only ``GroupedQuantizer`` weight quantizers are touched; other linears run the original as is.
    A member is restored only when the original left it without ``_amax``; the value restored is
    the one it had on entry (the buffer the previous ``set_from_modelopt_state`` or calibration
    created), moved to the weight's device. A later state-dict load overwrites it with the
    checkpoint's value; the grouped linear's per-expert shape check re-calibrates it if it no
    longer fits the weight.
    """

    @functools.wraps(post_restore)
    def modelopt_post_restore(self, prefix: str = ""):
        kept = [(q, q._amax) for q in static_block.expert_amax_holders(self)]
        post_restore(self, prefix=prefix)
        weight = getattr(self, "weight", None)
        for q, amax in kept:
            if getattr(q, "_amax", None) is None:
                device = weight.device if weight is not None else amax.device
                q.register_buffer("_amax", amax.detach().to(device))

    setattr(modelopt_post_restore, _MARK, True)
    return modelopt_post_restore


# --- (c) row-parallel shard axis for every expert index -------------------------------------------
def row_parallel_shard_axis_dict(self, state_dict):
    """Row-parallel shard axes, resolving the quantizer that owns each key.

    Same rule as 0.47.0 (static block amax, axis a tuple, is sharded along dim 1;
    ``input_quantizer._pre_quant_scale`` along dim 0; ``_global_amax`` never), but the owning
    quantizer is looked up from the key itself, so ``weight_quantizer.{i}`` works for every
    expert ``i`` (and for nested containers) instead of only ``.0`` and ``.1``.
    """
    from modelopt.torch.quantization.nn import TensorQuantizer

    axes = {}
    for k in state_dict:
        if k == "input_quantizer._pre_quant_scale":
            axes[k] = 0
        elif "weight_quantizer." in k and not k.endswith("_global_amax"):
            try:
                owner = self.get_submodule(k.rsplit(".", 1)[0])
            except AttributeError:
                continue
            if isinstance(owner, TensorQuantizer) and isinstance(owner.axis, tuple):
                axes[k] = 1
    return axes


setattr(row_parallel_shard_axis_dict, _MARK, True)


# --- apply -----------------------------------------------------------------------------------------
def _require_calls(func, names, what):
    """Refuse to wrap a method whose body no longer makes the calls the wrapper relies on."""
    missing = [n for n in names if n not in func.__code__.co_names]
    if missing:
        raise Refused(
            f"moe_ckpt_fix: {what} does not reference {missing}; the installed modelopt is not the "
            "0.47.0 source this fix was written for. Nothing was patched."
        )


def apply(unproven: tuple[str, ...] = ()) -> str:
    """Install (a) to (f), and (g) (asked for by ``unproven`` while it is in UNPROVEN_PARTS). Called through
    ``moe_ckpt_fix.apply()`` after the version check."""
    global _applied, _parts
    if _applied is not None:
        return _applied

    import modelopt.torch.quantization.plugins.custom as custom
    import modelopt.torch.quantization.plugins.megatron as mp

    if not getattr(mp, "HAS_TE", False) or not hasattr(mp, "_QuantMegatronTEGroupedLinear"):
        raise TransformerEngineMissing(
            "moe_ckpt_fix: modelopt's Transformer Engine plugin classes "
            "(_QuantMegatronTEGroupedLinear, TEGroupedMLP support) are not defined because "
            "transformer_engine / megatron.core.extensions.transformer_engine is not importable "
            "in this environment. The bug this fix addresses only exists with TEGroupedMLP; "
            "install Transformer Engine (or do not apply the fix). Nothing was patched."
        )

    grouped = mp._QuantMegatronTEGroupedLinear
    row = mp._MegatronRowParallelLinear
    parallel = custom._ParallelLinear
    _require_calls(grouped.sharded_state_dict, ["make_sharded_tensors_for_checkpoint"],
                   "_QuantMegatronTEGroupedLinear.sharded_state_dict")
    _require_calls(parallel.modelopt_post_restore, ["reset_amax"],
                   "_ParallelLinear.modelopt_post_restore")

    # Wrap before installing anything, so a failure leaves modelopt untouched.
    install_static = static_block.prepare(mp)
    install_unloaded = unloaded_amax.prepare(mp)
    new_make = mp.make_sharded_tensors_for_checkpoint
    if not getattr(new_make, _MARK, False):
        new_make = wrap_make_sharded_tensors(new_make)
    new_ssd = grouped.sharded_state_dict
    if not getattr(new_ssd, _MARK, False):
        new_ssd = wrap_grouped_sharded_state_dict(new_ssd)
    new_post = parallel.modelopt_post_restore
    if not getattr(new_post, _MARK, False):
        new_post = wrap_post_restore(new_post)
    new_extra = mp.quant_module_set_extra_state
    if not getattr(new_extra, _MARK, False):
        new_extra = legacy_load.wrap_set_extra_state(new_extra)

    mp.make_sharded_tensors_for_checkpoint = new_make
    grouped.sharded_state_dict = new_ssd
    parallel.modelopt_post_restore = new_post
    row._get_shard_axis_dict = row_parallel_shard_axis_dict
    # Read by name when modelopt registers each QuantModule's extra-state callbacks (at
    # quantize / restore time, after this apply()).
    mp.quant_module_set_extra_state = new_extra
    legacy_load.install_dist_load()
    static = install_static()
    _parts = (EXPERT_AMAX_PART, STATIC_BLOCK_PART)
    if wanted(UNLOADED_AMAX_PART, unproven):  # around (f)'s wrapper: it runs first
        static += "; " + install_unloaded()
        _parts += (UNLOADED_AMAX_PART,)

    _applied = (
        "nvidia-modelopt 0.47.0 patched (moe_ckpt_fix): "
        "(a) per-expert weight_quantizer sharded entries of _QuantMegatronTEGroupedLinear use the "
        "expert TP/DP groups, replica_id=(0, etp_rank, edp_rank); "
        "(b) _ParallelLinear.modelopt_post_restore keeps every GroupedQuantizer member's amax; "
        "(c) _MegatronRowParallelLinear._get_shard_axis_dict resolves every weight_quantizer.{i}; "
        "(d, e) older checkpoints load: a pre-0.47 shared weight-quantizer amax goes to every "
        "expert, an expert amax missing from the checkpoint is re-derived by max calibration; "
        + static
    )
    return _applied
