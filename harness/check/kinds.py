"""What each amax kind of a module family's weights does under a pair: the ``KindRule`` and its
constructors, each with where in the sources it was read and where it was checked. The pair's
table (harness/check/versions.py ``Behaviour.kinds``) picks them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.check.defects import RESTORE_DRY_RUN, STATIC_REFUSAL, RestoreDefect
from harness.model.recipes import (EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL, SCALAR,
                                   SHARED_EXPERTS, STATIC_BLOCK)
from harness.records import Expected


@dataclass(frozen=True)
class KindRule:
    """What one pair does with one amax kind (harness/check/recipes.py) of one module family's
    weights, split as the family is (FAMILY_SPLIT: routed experts by expert TP, the rest by TP)."""

    # The family's tensors of this kind get the pair's per-expert replica ids
    # (Behaviour.replica_rule): they collide wherever the scalar expert amax does. False for dense
    # linears, whose replica ids are megatron-core's defaults (dense TP and DP: right for them).
    replica_rule_applies: bool
    # The second bug reaches this kind: load_state_dict re-calibrates it through expert 0.
    lost_on_reload: bool
    # What a load at another split size (ETP for experts, TP otherwise) than the save's gives (an
    # Expected word); None: no rule (nothing was read or run that decides it): ``rule-unknown``.
    reshard: str | None
    # Calibrating this kind with its family split > 1 is refused by ModelOpt: the text of its
    # refusal (such a save is refused when the cell is planned), None: allowed.
    save_refused_split: str | None = None
    source: str = ""
    checked_on: str = ""
    # A defect of ModelOpt's own that every stage restoring its state meets with this kind
    # (RESTORE_DRY_RUN: the grouped post-restore's dry run on amax nothing has loaded yet), or
    # None. Set by ``Behaviour.kind_rule`` for the pair and the fix's parts, never by hand.
    restore_defect: RestoreDefect | None = None


# How each module family's weights are split: routed experts over expert TP, shared experts and
# every dense linear (attention, dense MLP, Mamba projections, the output layer) over TP
# (megatron-core 0.19.2 transformer/moe/experts.py builds TEGroupedMLP with the expert TP group;
# moe/shared_experts.py SharedExpertMLP is an MLP with the dense TP group).
FAMILY_SPLIT = {EXPERTS: "etp", SHARED_EXPERTS: "tp", OTHER: "tp"}


def split_of(family: str, topo) -> int:
    """The size a family's weights are split over at ``topo`` (a family not listed: dense TP)."""
    return getattr(topo, FAMILY_SPLIT.get(family, "tp"))


# One amax of shape (1,) per expert quantizer (dynamic NVFP4's global amax, FP8 per-tensor): the
# kind every rule below was first written and checked for. Replicated across expert TP (no
# shard axis: 0.47.0 plugins/megatron.py Column/Row _get_shard_axis_dict give axis None no
# axis), so an ETP change reshards it like any replicated tensor.
_SCALAR_SOURCE = ("0.47.0 plugins/megatron.py:917-946 and 0.48.0rc1 :960-990 build every "
                  "weight_quantizer.{i}.* of a grouped linear the same way; axis None -> no "
                  "shard axis (_get_shard_axis_dict), a replicated (1,) tensor per expert")
_STATIC_SOURCE = (
    "0.47.0 plugins/megatron.py:917-946 (0.48.0rc1 :960-990): _amax and _global_amax are both "
    "weight_quantizer.{i}.* subs, built with the same replica ids as the scalar amax; the block "
    "quantizer's axis is None, so _get_shard_axis_dict gives the block _amax no shard axis: it is "
    "written as a replicated tensor of its LOCAL shape (the expert weight's ETP shard / 16); "
    "plugins/custom.py modelopt_post_restore (0.47.0 :150-181) skips the reset and re-calibration "
    "when the restored static state is complete (amax numel == weight numel / 16), so the second "
    "bug does not reach it at the save's ETP; model_calib.py (0.47.0 :370-376, 0.48.0rc1 the "
    "same) calls _check_nvfp4_static_tp_supported, which refuses static NVFP4 calibration when "
    "the module's TP group (expert TP for TEGroupedLinear, plugins/megatron.py :968-973) is > 1. "
    "At another expert TP the restored buffer keeps the saved shape while the block _amax is sharded "
    "over expert TP, so megatron-core 0.19.2's load planner (dist_checkpointing/strategies/torch.py "
    "_validate_global_shapes :534) refuses: Global shape mismatch")


def scalar_rule(drops_on_reload: bool) -> KindRule:
    return KindRule(replica_rule_applies=True, lost_on_reload=drops_on_reload, reshard=Expected.PASS,
                    source=_SCALAR_SOURCE)


# Checked on one H100, tier gpu-shared, megatron-core 0.19.2 (docs/runs/20261206-0354-recipes.md):
# ETP 1 -> 2 and 1 -> 4 loads refused with "Global shape mismatch for loaded (4096, 1) and expected
# (8192, 1)" on 0.47.0, 0.47.0 + harness.fix and 0.48.0rc1 alike; same-ETP loads pass.
_STATIC_CHECKED = ("gpu-shared, H100, megatron-core 0.19.2: docs/runs/20261206-0354-recipes.md "
                   "(0.47.0, 0.47.0 + harness.fix, 0.48.0rc1)")


def static_block_rule(checked_on: str = _STATIC_CHECKED) -> KindRule:
    return KindRule(replica_rule_applies=True, lost_on_reload=False,
                    reshard=Expected.RESHARD_REFUSED,
                    save_refused_split=STATIC_REFUSAL, source=_STATIC_SOURCE,
                    checked_on=checked_on)


# The routed experts' static kind under the fix's part (f) (moe_ckpt_fix/static_block.py), used
# only for a cell whose ranks recorded that they installed it (CellRecord.fix_parts; before a save
# has run, the scenario's ``fix_parts`` says it needs it): a wheel before 0.3.0 installed (f) only
# when asked for, so a record that does not name it keeps the rule above. Read from the fix and megatron-core
# 0.19.2 (0.16.1 the same where read). The checkpoint keeps ModelOpt's ETP-1 format whatever the
# ETP of the save, so what a patched job writes an unpatched one reads as before (at ETP 1; at
# another ETP it keeps the rule above):
_FIXED_STATIC_SOURCE = (
    "moe_ckpt_fix/static_block.py replicated_whole: each per-expert block _amax is declared as "
    "ModelOpt declares it at ETP 1, the expert's whole (N, 1) in row-major block order (a gated "
    "fc1's [W; V] rows, as megatron-core 0.19.2 lays the ETP-1 weight out: "
    "apply_swiglu_sharded_factory, transformer/mlp.py:425-495), replicated over expert TP "
    "(replica id (0, etp_rank, edp)), a ShardedTensorFactory whose build all-gathers the ranks' "
    "parts over the expert TP group (fc1 rows, TEColumnParallelGroupedLinear; fc2 columns, "
    "TERowParallelGroupedLinear: extensions/transformer_engine.py:2508-2590) and whose merge "
    "cuts the loaded whole to the rank's part: a save at any expert TP writes what ETP 1 writes, "
    "a load at any expert TP reads it; fit_block_amax refits a buffer restored with another "
    "expert TP's shape before the load; the global amax stays a per-expert (1,) replicated "
    "across expert TP (part a), reduced over the expert TP group at calibration, where "
    "nvfp4_static_tp_check lets grouped experts through. cpu tier: tests/test_static_block.py, "
    "tests/test_static_block_reshard.py (torch_dist save/load across expert TP on gloo ranks, "
    "an ETP-2 save byte-equal to an ETP-1 one, read by an unpatched ETP-1 load)")


# Checked on one H200, tier gpu-shared, megatron-core 0.19.2, under 0.47.0 + fix and 0.48.0rc1 +
# fix: the Ultra (nvfp4-4o6) and Super (nvfp4-mse) reshard grids, saves at ETP 1 and 2, loads at
# ETP 1, 2 and 4 with TP, EP and pp changes: 14/14 pass each, every load bit-exact.
_FIXED_STATIC_CHECKED = ("gpu-shared, H200, megatron-core 0.19.2: docs/runs/20261206-202850-recipes-"
                         "0.47.0-fix.md, -0.48.0rc1-fix.md (Ultra), docs/runs/20261206-203123-"
                         "recipes-0.47.0-fix.md, -0.48.0rc1-fix.md (Super)")


def fixed_static_block_rule() -> KindRule:
    """Static block amax of routed experts under part (f): loads at another expert TP pass and
    a save at expert TP > 1 is allowed."""
    return KindRule(replica_rule_applies=True, lost_on_reload=False, reshard=Expected.PASS,
                    save_refused_split=None, source=_FIXED_STATIC_SOURCE,
                    checked_on=_FIXED_STATIC_CHECKED)


# Dense linears (shared experts, attention, dense MLP, Mamba projections): ModelOpt's
# _MegatronParallelLinear.sharded_state_dict (0.47.0 plugins/megatron.py:508-551) builds their
# quantizer tensors with make_sharded_tensors_for_checkpoint and no group arguments, i.e.
# megatron-core's default replica ids (dense TP, dense DP), which are right for a dense linear:
# nothing collides. _get_shard_axis_dict (Column :557-581, Row :587-621) gives a weight amax of
# axis None (dynamic NVFP4, FP8 per-tensor, static NVFP4 blocks) no shard axis and skips
# _global_amax (:572-575, :604-607): a replicated tensor of the LOCAL shape. No GroupedQuantizer,
# so the second bug (post-restore re-calibration through expert 0) does not reach them.
_DENSE_SOURCE = ("0.47.0 plugins/megatron.py:508-551 (default replica ids: dense TP and DP), "
                 "_get_shard_axis_dict :557-581 / :587-621 (axis None: no shard axis, "
                 "_global_amax skipped)")
# Every committed default-recipe run (attention linears NVFP4, scalar) reloads at other TP sizes.
_DENSE_SCALAR_CHECKED = ("gpu-shared, megatron-core 0.19.2: the default recipe's attention "
                         "linears at TP changes (docs/runs/20261203-000204-matrix.md)")


def dense_scalar_rule() -> KindRule:
    """A (1,) amax replicated over TP: a TP change reshards it like any replicated tensor."""
    return KindRule(replica_rule_applies=False, lost_on_reload=False, reshard=Expected.PASS,
                    source=_DENSE_SOURCE, checked_on=_DENSE_SCALAR_CHECKED)


_DENSE_STATIC_CHECKED = ("gpu-shared, H100, megatron-core 0.19.2: docs/runs/20261206-234245-recipes-"
                         "0.48.0rc1-none.md, 20261206-234246-recipes-0.47.0-fix.md and "
                         "20261206-234246-recipes-0.48.0rc1-fix.md (tp1-etp1-ep2 -> tp2-etp1-ep2: "
                         "0 mismatches of 166-198 keys, logits exact)")


def dense_static_block_rule() -> KindRule:
    """Static NVFP4 blocks of a dense linear: calibration refused at TP > 1
    (_check_nvfp4_static_tp_supported reads every QuantModule's TP group, 0.47.0
    plugins/megatron.py:86-113, whose own docstring says the block _amax "is shard-local but
    sharded_state_dict treats it as replicated"); at the save's TP it loads as saved. At another
    TP the sources read do not decide it; the GPU run does: a TP-1 save (NVFP4_FOUR_OVER_SIX_CFG:
    static blocks on every dense linear) reloads at TP 2 with every key equal to the saved state
    sliced for the load rank and logits exact, on 0.47.0 + fix, 0.48.0rc1 and 0.48.0rc1 + fix."""
    return KindRule(replica_rule_applies=False, lost_on_reload=False, reshard=Expected.PASS,
                    save_refused_split=STATIC_REFUSAL, source=_DENSE_SOURCE,
                    checked_on=_DENSE_STATIC_CHECKED)


# --- per-channel, per-block and no-amax: read from the sources only --------------------------------
# (checked_on ""; tools/gpu-host/queues/amax-kinds.txt runs the cells that check them).
# Paths are of the installed 0.47.0 (modelopt/torch/quantization/...) and of the 0.48.0rc1 wheel;
# megatron-core 0.19.2 (megatron/core/...).
# Decided on the GPU (one H100, tier gpu-shared, megatron-core 0.19.2, 2026-12-06 23:40, the
# integer kind sets under harness.fix with part (g): docs/runs/20261206-2335-device-session.md).
_INTEGER_CHECKED = ("gpu-shared, H100, megatron-core 0.19.2: docs/runs/20261206-234019-recipes-"
                    "0.47.0-fix.md and docs/runs/20261206-234018-recipes-0.48.0rc1-fix.md "
                    "(harness.fix with part g; part g changes values only, no shape)")
_EXPERT_RESHARD_READ = (
    "at another expert TP the Column (linear_fc1) entry is cut along axis 0 (plugins/megatron.py:"
    "577-578 axis not None -> 0), so the load asks for the buffer's LOCAL shape times ETP; the "
    "buffer has the load's shape only if _QuantTEGroupedLinear.modelopt_post_restore's dry run "
    "(plugins/transformer_engine.py:205-233) raised a RuntimeError naming a size or shape and so "
    "re-calibrated it")
_PER_CHANNEL_RESHARD = (
    _EXPERT_RESHARD_READ + ". A per-channel amax of the save's length raises nothing there "
    "(ModelOpt's CUDA kernel asserts only amax.numel() != 0, kernels/quantization/gemm/"
    "tensor_quant.cpp:58): the buffer keeps the save's shape and megatron-core 0.19.2 refuses "
    "its global shape (GPU, tp1-etp1-ep2 -> tp1-etp2-ep1: 'Global shape mismatch for loaded "
    "(256, 1) and expected (512, 1)' on linear_fc1.weight_quantizer._amax)")
_PER_BLOCK_RESHARD = (
    _EXPERT_RESHARD_READ + ". A per-block amax of the save's length does not fit the load's "
    "block reshape, so the dry run raises and the buffer is re-calibrated to the load's local "
    "shape before the load's sharded_state_dict is built: the load passes (GPU, tp1-etp1-ep2 -> "
    "tp1-etp2-ep1: every key and expert amax restored, logits exact at the load topology)")
_PER_CHANNEL_EXPERTS = (
    "per-channel (axis 0, e.g. INT8_WEIGHT_ONLY_CFG): one amax per output channel. "
    "linear_fc2 (Row): an int axis is not a tuple, so no shard axis (0.47.0 plugins/megatron.py:"
    "616; 0.48.0rc1 the same): replicated, (hidden, 1) at every expert TP. linear_fc1 (Column): "
    "sharded along axis 0 (:577-578). ")
_PER_BLOCK_EXPERTS = (
    "per-block (static blocks without a global amax, e.g. INT4_BLOCKWISE_WEIGHT_ONLY_CFG): the "
    "block quantizer's axis becomes a tuple at its first forward (nn/modules/tensor_quantizer.py:"
    "986-989); linear_fc1 (Column) sharded along axis 0 (plugins/megatron.py:577-578); "
    "linear_fc2 (Row) along axis 1 only for weight_quantizer.0/.1 (:609-617; 0.48.0rc1 "
    ":650-658 the same; the fix's part (c) resolves every expert), members >= 2 replicated of "
    "their local shape. ")
_NO_AMAX_SOURCE = (
    "no-amax (MX formats, e.g. MXFP8_DEFAULT_CFG, algorithm None: e8m0 block scales computed at "
    "run time, no calibration): the quantizers hold no _amax, and the sharded state dict takes "
    "only keys with _amax, input_quantizer._pre_quant_scale or _parameter_to_keep_in_quantizer_"
    "state_dict (False for fake quant, :498-506); any other quantizer state is only warned about "
    "(0.47.0 plugins/megatron.py:520-531 dense, :874-886 grouped; 0.48.0rc1 :561-572, :919-931): "
    "no per-expert quantizer tensor exists, so no replica id can collide and nothing is "
    "resharded; custom.py:177 re-calibrates only a quantizer that has an _amax (no second bug). "
    "What remains is the grouped linear's _extra_state (quantizer_state), which megatron-core's "
    "TEGroupedLinear builds with the expert groups, as for every other recipe")


# What a routed-expert integer kind's amax is, and what it does at another expert TP (decided on
# the GPU): the two rules differ only here.
_INTEGER_EXPERTS = {PER_CHANNEL: (_PER_CHANNEL_EXPERTS, _PER_CHANNEL_RESHARD, Expected.RESHARD_REFUSED),
                    PER_BLOCK: (_PER_BLOCK_EXPERTS, _PER_BLOCK_RESHARD, Expected.PASS)}


def integer_expert_rule(kind: str, drops_on_reload: bool, source: str,
                        restore_defect: RestoreDefect | None = None) -> KindRule:
    """A per-channel or per-block routed-expert amax: the scalar's replica ids, its reshard as
    the GPU decided; ``restore_defect``: RESTORE_DRY_RUN where the release's restore reaches it
    unpatched."""
    what, reshard_source, reshard = _INTEGER_EXPERTS[kind]
    return KindRule(replica_rule_applies=True, lost_on_reload=drops_on_reload, reshard=reshard,
                    source=what + source + "; " + reshard_source,
                    restore_defect=restore_defect, checked_on=_INTEGER_CHECKED)


def no_amax_rule() -> KindRule:
    """Nothing of the quantizer is a tensor of the checkpoint: nothing to collide, lose or
    reshard (the family's weights reshard as megatron-core's own)."""
    return KindRule(replica_rule_applies=False, lost_on_reload=False, reshard=Expected.PASS,
                    source=_NO_AMAX_SOURCE)


def dense_per_channel_rule() -> KindRule:
    """Per-channel amax of a dense linear: Column cut along axis 0 over TP like its weight, Row
    replicated ((out, 1) is the same at every TP); the post-restore re-calibration gives the
    buffer the load's local shape first, so a TP change reshards it."""
    return KindRule(
        replica_rule_applies=False, lost_on_reload=False, reshard=Expected.PASS,
        source=_DENSE_SOURCE + "; per-channel: Column axis 0 (0.47.0 plugins/megatron.py:577-578) "
        "with megatron-core's default TP offsets (core/utils.py:1012), Row no shard axis (:616, an "
        "int axis), (out_local, 1) by _process_quantizer_amax (:484-490); at the load, "
        "plugins/custom.py:177-181 (0.48.0rc1 :180-186, a TensorQuantizer is not a "
        "GroupedQuantizer) resets and re-calibrates the restored amax from the LOCAL weight "
        "before the load's sharded_state_dict is built (plugins/megatron.py:224-246 "
        "quant_module_set_extra_state, then the second load_state_dict), so the load asks for "
        "the global shape the save wrote")


def dense_per_block_rule() -> KindRule:
    """Per-block amax of a dense linear: at the save's TP it loads as saved; at another TP the
    Row entry is refused (decided on the GPU: the restored buffer keeps the save's shape)."""
    return KindRule(
        replica_rule_applies=False, lost_on_reload=False, reshard=Expected.RESHARD_REFUSED,
        source=_DENSE_SOURCE + "; per-block: Column axis 0, Row axis 1 (the quantizer's own axis, "
        "a tuple, plugins/megatron.py:609-617); the post-restore re-calibration "
        "(custom.py:177-181) keeps the cached _block_reshape_size (nn/modules/tensor_quantizer.py:"
        "1001-1002) of the save's shape: at another TP megatron-core 0.19.2 refuses the Row "
        "entry's global shape (GPU, tp1 -> tp2: 'Global shape mismatch for loaded (256, 1) and "
        "expected (256, 2)' on shared_experts.linear_fc2.weight_quantizer._amax)",
        checked_on=_INTEGER_CHECKED)



def measures_logits(pp: int, cuda: bool) -> bool:
    """Whether a stage measures logits (harness/rank/stages.py): at pp > 1 the forward goes
    through megatron-core's pipeline schedule, which allocates its receive buffers on CUDA."""
    return pp == 1 or cuda


def reload_keeps_state(patched: bool, local: bool,
                       expert_rules: list | Callable[[], list]) -> bool:
    """Whether a save's reload of its checkpoint keeps ModelOpt's state, so its logits are a
    reference: patched, the local backend, or every routed-expert kind with a rule that loses
    nothing on reload (unpatched 0.47.0's second bug leaves no trustworthy reference).
    ``expert_rules`` may be a callable, asked only when needed (a rank imports ModelOpt for it)."""
    if patched or local:
        return True
    rules = expert_rules() if callable(expert_rules) else expert_rules
    return bool(rules) and all(r is not None and not r.lost_on_reload for r in rules)


def reference_reload(patched: bool, local: bool, expert_rules: list, pp: int, cuda: bool) -> bool:
    """Whether a save stage reads its checkpoint back into a model built afresh (its reference
    logits, harness/rank/stages.py save_stage), i.e. restores ModelOpt's state a second time."""
    return measures_logits(pp, cuda) and reload_keeps_state(patched, local, expert_rules)


def expert_kinds(lost_on_reload: bool, source: str, restore_dry_run: bool = False) -> dict[str, KindRule]:
    """The routed experts' rules per amax kind where the per-expert grouped plugin holds (0.47.0,
    0.48.0rc1; mcore 0.16.x|0.19.2): the channel and block kinds share the scalar's replica ids,
    ``lost_on_reload`` where post-restore re-calibrates through expert 0, ``source`` says why;
    ``restore_dry_run`` where the release's own restore meets RESTORE_DRY_RUN (unpatched; under
    the fix, ``Behaviour.kind_rule`` decides by its parts)."""
    defect = RESTORE_DRY_RUN if restore_dry_run else None
    return {STATIC_BLOCK: static_block_rule(),
            **{kind: integer_expert_rule(kind, lost_on_reload, source, defect)
               for kind in _INTEGER_EXPERTS},
            NO_AMAX: no_amax_rule()}


DENSE_WITH_STATIC = {SCALAR: dense_scalar_rule(), STATIC_BLOCK: dense_static_block_rule(),
                      PER_CHANNEL: dense_per_channel_rule(), PER_BLOCK: dense_per_block_rule(),
                      NO_AMAX: no_amax_rule()}
