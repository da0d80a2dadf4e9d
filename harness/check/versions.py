"""What each (nvidia-modelopt, megatron-core) pair does to a TEGroupedMLP checkpoint: one place,
as data.

The bug depends on both packages: ModelOpt builds the amax ShardedTensors with megatron-core's
helpers, and what those helpers put in replica_id changed in megatron-core 0.16. Every
expectation the harness judges against comes from the rule of the pair a cell actually ran in
(recorded by its ranks), never from the harness's own output. Each rule says where in both
packages' sources it was read; recorded GPU metadata and the runs under docs/runs/ check it.

A pair not listed gets ``UNKNOWN`` ("rule unknown"): nothing is predicted, its cells are judged
``rule-unknown``; never another pair's rule.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.check.layouts import CkptLayout, GoldenLayout, Restore
from harness.model.recipes import (EXPERTS, NO_AMAX, OTHER, PER_BLOCK, PER_CHANNEL, SCALAR,
                                   SHARED_EXPERTS, STATIC_BLOCK)
from harness.records import Expected, Stage
from harness.fix import EXPERT_AMAX_PART, PARTS_ONLY_VERSIONS, STATIC_BLOCK_PART, UNLOADED_AMAX_PART

# Layout of a grouped linear's weight quantizer in the checkpoint a release writes.
SHARED, PER_EXPERT = CkptLayout.SHARED, CkptLayout.PER_EXPERT
# What an unpatched load of a golden checkpoint of each layout gives (GoldenLayout: shared =
# pre-0.47, complete / incomplete = per-expert with all / some amax).
RESTORED, NOT_RESTORED = Restore.RESTORED, Restore.NOT_RESTORED


# megatron-core bands whose sources differ where it matters (read from the wheels):
# < 0.16: TEGroupedMLP.sharded_state_dict is wrapped in expert_dist_ckpt_decorator (0.15.3
#   transformer/moe/experts.py:62-94, applied at :965), which swaps parallel_state's TP rank for
#   the expert-TP rank during the call; make_sharded_tensors_for_checkpoint takes no group
#   arguments (0.15.3 transformer/utils.py:76-82) and defaults replica_id to
#   (0, get_tensor_model_parallel_rank(), dense DP rank) (0.15.3 utils.py:836-856).
# >= 0.16: the decorator is gone (0.16.1 moe/experts.py:768-781 passes tp_group=self.tp_group to
#   the sub-modules instead; Megatron-LM #2053/#2506), make_sharded_tensors_for_checkpoint takes
#   tp_group/dp_cp_group (0.16.1 transformer/utils.py:81-82; 0.19.2 :101-102) and without them
#   uses the DENSE TP and DP groups (0.16.1 utils.py:1017-1020).
# Only the releases whose sources were read (0.15.3, 0.16.1, 0.19.2; the 0.15/0.16 patch series
# with them); 0.17.x-0.19.0 were not read, so their pairs are "rule unknown".
MCORE_DECORATOR_ERA, MCORE_GROUPS_ERA = "==0.15.*", "==0.16.* || ==0.19.2"
REFERENCE_MCORE = "0.19.2"  # every run before pairs were recorded used it

# megatron-core's torch_dist on-disk format. <= 0.16 writes common.pt and cannot read a checkpoint
# without it (0.16.1 dist_checkpointing/strategies/common.py:83-98: load_common raises
# FileNotFoundError, and its own error path then fails on the str path: AttributeError "'str'
# object has no attribute 'iterdir'"; 0.15.3 the same). 0.19.2 keeps non-tensor state inside DCP
# and writes no common.pt (0.19.2 strategies/common.py:41-44: load_common "is deprecated ...
# torch_dist now handles all non-tensor data as part of default PyTorch DCP"). Checked on the
# H200: every golden (written by 0.19.2) refused by 0.15.3 and 0.16.1 that way
# (docs/runs/20261204-0203-pairs.md). Releases between 0.16.1 and 0.19.2 were not read.
NEEDS_COMMON_PT = "==0.15.* || ==0.16.*"


def in_band(band: str, mcore: str) -> bool:
    """Whether megatron-core ``mcore`` is in ``band``: PEP 440 specifiers, "||" between
    alternatives; an empty band holds nothing."""
    return any(SpecifierSet(alt.strip(), prereleases=True).contains(mcore)
               for alt in band.split("||") if alt.strip())
COMMON_PT = "common.pt"


def common_pt_problem(ckpt_dir, mcore: str | None, shown=None) -> str | None:
    """Why megatron-core ``mcore`` cannot read the torch_dist checkpoint at ``ckpt_dir`` (it has
    no common.pt and this megatron-core needs one), or None; ``shown``: the path to print."""
    from pathlib import Path

    try:
        needs = in_band(NEEDS_COMMON_PT, mcore or "")
    except InvalidVersion:
        return None
    if not needs or (Path(ckpt_dir) / COMMON_PT).is_file():
        return None
    return (f"{shown or ckpt_dir}: no {COMMON_PT}: megatron-core {mcore} reads only torch_dist checkpoints "
            f"that have one (written by megatron-core <= 0.16); this one was written by a newer "
            f"megatron-core (0.19.2 keeps non-tensor state inside DCP): load it with the "
            "megatron-core that wrote it")


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
    restore_defect: "RestoreDefect | None" = None


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
# Static NVFP4 (block type static): ``_amax`` (weight numel / 16, 1) and ``_global_amax`` (1,).
_STATIC_REFUSAL = ("NotImplementedError: Static-block NVFP4 weight quantization (e.g. MSE) is not "
                   "supported with TP > 1")
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
                    save_refused_split=_STATIC_REFUSAL, source=_STATIC_SOURCE,
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
                    save_refused_split=_STATIC_REFUSAL, source=_DENSE_SOURCE,
                    checked_on=_DENSE_STATIC_CHECKED)


# --- per-channel, per-block and no-amax (issue 52 item 3): read from the sources only ------------
# (checked_on ""; tools/gpu-host/queues/next-issue52-kinds.txt runs the cells that check them).
# Paths are of the installed 0.47.0 (modelopt/torch/quantization/...) and of the 0.48.0rc1 wheel;
# megatron-core 0.19.2 (megatron/core/...).
_EXPERT_ENTRIES_047 = (
    "0.47.0 plugins/megatron.py:876-881 collects every weight_quantizer.{i}.*_amax of a grouped "
    "linear, :833-839 keeps its native (channel or block) shape, :936 builds it with "
    "make_sharded_tensors_for_checkpoint(expert_state, '', expert_axis, offsets) and no groups, "
    ":946 replica_id[2] := expert-DP rank. No groups -> the DENSE TP group (megatron-core 0.19.2 "
    "transformer/utils.py:131-133): an entry with no shard axis gets replica_id (0, dense tp rank, "
    "edp) (core/utils.py:1149-1150, the scalar amax's collision); one with a shard axis gets "
    "offsets (axis, dense tp rank, dense tp size) and replica_id (0, 0, edp) (core/utils.py:1012, "
    ":1075-1076): wherever TP != ETP it is cut over the wrong group, so it is refused where the "
    "replicated entries collide")
_SECOND_BUG_047 = (
    "0.47.0 plugins/custom.py:177-181: a weight quantizer with an _amax that is not complete "
    "static NVFP4 is reset (GroupedQuantizer.reset_amax: every member) and re-calibrated through "
    "GroupedQuantizer.forward (nn/modules/tensor_quantizer.py:1914-1916: member 0 only); "
    "plugins/transformer_engine.py:202-204 then skips the members left without _amax: the "
    "second bug, whatever the amax's shape")
_NO_SECOND_BUG_048 = ("0.48.0rc1 plugins/custom.py:180-186 skips a GroupedQuantizer in the "
                      "reset + re-calibration: no second bug")
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
                        restore_defect: "RestoreDefect | None" = None) -> KindRule:
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


@dataclass(frozen=True)
class ModelDefect:
    """A refusal of megatron-core's own, on a tensor of the model rather than a quantizer's: what
    a checkpoint of that model meets at a topology whatever the nvidia-modelopt. Judged as a known
    refusal (``Expected.MTP_EMBEDDING_REFUSED`` -> ``known-refusal``) where its release band was
    read, as ``rule-unknown`` on another megatron-core; never as the collision."""

    label: str
    mcore: str  # PEP 440 band of the megatron-core releases whose sources were read
    exception: str  # the exception type's name
    text: str  # what its message says
    key: str  # the checkpoint key it names
    source: str
    finding: str  # the record's reason when it is seen where predicted
    checked_on: str = ""

    def reached(self, mtp_num_layers: int | None, position_embedding: str | None, topo) -> bool:
        """Whether a model with these modules meets it at ``topo`` (a save or a load)."""
        return bool(mtp_num_layers) and position_embedding == "learned_absolute" and topo.pp > 1


# MTP at pipeline depth > 1 with a learned absolute position embedding (issue 52 item 4). Read in
# megatron-core 0.19.2 (paths under megatron/core/): without a pipeline layout the MTP block sits
# on the last stage (transformer/multi_token_prediction.py:651-656), which at pp > 1 is not the
# first; GPTModel builds that stage its own LanguageModelEmbedding (models/gpt/gpt_model.py:
# 167-175; HybridModel the same, models/hybrid/hybrid_model.py:234-242), whose learned absolute
# position embedding is a torch.nn.Embedding (models/common/embeddings/language_model_embedding.py:
# 44, :66-69). LanguageModule.sharded_state_dict ties only the word embedding of the MTP stage to
# the first stage's (models/common/language_module/language_module.py:441-449: replica id (1, 0,
# dp) from transformer/multi_token_prediction.py:85-99); the position embedding keeps the default
# replica id (0, tp rank, dp rank) of make_sharded_tensor_for_checkpoint (utils.py:1149-1150,
# through transformer/utils.py:182-188) on both stages, so the key has two main replicas and
# validate_sharding_integrity refuses it (dist_checkpointing/validation.py:437-443, raised at
# :401-403). Nor does setup_embeddings_and_output_layer sync it (language_module.py:300-308 all-
# reduces the word embedding only): the MTP stage's copy keeps its own initialisation. Nemotron-3
# models have no learned position embedding (harness/model/modules.py): the jobs never meet it.
MTP_POSITION_EMBEDDING = ModelDefect(
    label="MTP at pp > 1 with a learned absolute position embedding",
    mcore="==0.19.2",
    exception="CheckpointingException",
    text="Invalid access pattern",
    key="embedding.position_embeddings.weight",
    source=("megatron-core 0.19.2 models/common/language_module/language_module.py:441-449 ties "
            "only embedding.word_embeddings.weight of the MTP stage's own LanguageModelEmbedding "
            "(models/gpt/gpt_model.py:167-175) to the first stage's; its learned absolute "
            "embedding.position_embeddings.weight keeps replica id (0, tp, dp) on both stages: two "
            "main replicas, refused by dist_checkpointing/validation.py:437-443"),
    finding=("megatron-core 0.19.2 refuses embedding.position_embeddings.weight at pp > 1 with "
             "MTP: the MTP stage's own learned absolute position embedding is a second main "
             "replica (models/common/language_module/language_module.py:441-449 ties only the "
             "word embedding); a defect of megatron-core, not the collision; Nemotron-3 models "
             "have no learned position embedding"),
)
MODEL_DEFECTS = (MTP_POSITION_EMBEDDING,)


def model_defect(mtp_num_layers: int | None, position_embedding: str | None, save,
                 load) -> tuple[ModelDefect, str] | None:
    """The model defect a cell's save or load meets, and the stage that meets it first (save,
    then load), or None, whatever the megatron-core: the caller decides what a release outside
    its band gets (``defect_covers``)."""
    for defect in MODEL_DEFECTS:
        for stage, topo in ((Stage.SAVE, save), (Stage.LOAD, load)):
            if topo is not None and defect.reached(mtp_num_layers, position_embedding, topo):
                return defect, stage
    return None


def defect_covers(defect: ModelDefect, mcore: str | None) -> bool:
    try:
        return in_band(defect.mcore, mcore or "")
    except InvalidVersion:
        return False


@dataclass(frozen=True)
class RestoreDefect:
    """A defect of nvidia-modelopt's own restore, met by every stage that restores its state (the
    load stages, and the save stage's reference reload) with an amax kind it reaches: not the
    collision, not a property of the checkpoint. It is nondeterministic where it reads memory
    nothing initialised, so a stage may pass: expected ``Expected.RESTORE_DRY_RUN`` ("passes, or
    dies of it"), judged ``known-refusal`` on its own words (``texts``), and by the expectation
    behind it where it did not fire."""

    label: str
    texts: tuple[str, ...]  # what the stage's first failure says when it is this defect
    source: str
    finding: str  # the record's reason when it is seen where predicted
    checked_on: str = ""

    def seen(self, message: str | None) -> bool:
        return any(t in (message or "") for t in self.texts)


# ModelOpt's grouped post-restore dry run on amax that torch.empty made (issue 52 item 3; the
# fix's part (g), moe_ckpt_fix/unloaded_amax.py). Read in nvidia-modelopt 0.47.0 and 0.48.0rc1
# (paths under modelopt/torch/): the restore makes each quantizer buffer with torch.empty
# (quantization/nn/modules/tensor_quantizer.py _reset_pytorch_state_from_metadata, 0.47.0 :1361,
# 0.48.0rc1 :1364); the checkpoint's values load only afterwards (megatron-core's
# dist_checkpointing.load). Before that, _QuantTEGroupedLinear.modelopt_post_restore
# (quantization/plugins/transformer_engine.py:173-233, both releases) runs each expert's weight
# quantizer on its weight (wq_i(weight_i), :207) for every member that still has an _amax, and
# re-raises any error that is not a shape mismatch (a "device-side" one included). Integer fake
# quantization asserts amax >= 0 on the device (kernels/quantization/gemm/tensor_quant_gpu.cu:44
# CUDA_KERNEL_ASSERT(amax >= 0); without the CUDA extension quantization/tensor_quant.py 0.47.0
# :618-620, 0.48.0rc1 :631-633 raise ValueError "Negative values in amax"): uninitialised memory
# holding a negative value or a NaN ends the stage with a device-side assert, reported by the next
# synchronising call (the GPU run showed it in _ParallelLinear.modelopt_post_restore through
# calib/max.py). The members keep an _amax there where the reset passes GroupedQuantizer by:
# 0.48.0rc1 itself (quantization/plugins/custom.py:180-186), and 0.47.0 under the fix's part (b)
# (EXPERT_AMAX_PART, which mirrors it); unpatched 0.47.0 resets every member and re-calibrates
# member 0 first (custom.py:177-181), so only expert 0 has an _amax, a calibrated one. The fix's
# part (g) (UNLOADED_AMAX_PART) sets every negative or NaN entry to 0 before the dry run. Routed
# experts only (the grouped linear's dry run); dense linears re-calibrate from their weight first.
RESTORE_DRY_RUN = RestoreDefect(
    label="the grouped post-restore's dry run on expert amax not yet loaded",
    texts=("device-side assert", "Negative values in amax"),
    source=("nvidia-modelopt 0.47.0 / 0.48.0rc1 quantization/plugins/transformer_engine.py:173-233 "
            "(_QuantTEGroupedLinear.modelopt_post_restore: wq_i(weight_i) at :207 on the _amax "
            "torch.empty made, nn/modules/tensor_quantizer.py 0.47.0 :1361, 0.48.0rc1 :1364, before "
            "the checkpoint's values load); kernels/quantization/gemm/tensor_quant_gpu.cu:44 asserts "
            "amax >= 0 (tensor_quant.py 0.48.0rc1 :631-633 without the extension: 'Negative values "
            "in amax'); reached where members keep their amax through the reset: 0.48.0rc1 "
            "plugins/custom.py:180-186, 0.47.0 with the fix's part (b); fixed by part (g) "
            "(moe_ckpt_fix/unloaded_amax.py)"),
    finding=("nvidia-modelopt's _QuantTEGroupedLinear.modelopt_post_restore "
             "(plugins/transformer_engine.py:173-233) dry-runs each expert's integer weight "
             "quantizer on the _amax torch.empty made before the checkpoint's values load; the "
             "CUDA kernel asserts amax >= 0 (kernels/quantization/gemm/tensor_quant_gpu.cu:44), so "
             "uninitialised memory ends the restore with a device-side assert (nondeterministic); "
             "a defect of ModelOpt's, not the collision; the fix's part (g) "
             f"({UNLOADED_AMAX_PART}) removes it"),
)
# The routed experts' amax kinds integer fake quantization handles (the kernel's amax >= 0 assert).
DRY_RUN_KINDS = (PER_CHANNEL, PER_BLOCK)


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


@dataclass(frozen=True)
class Behaviour:
    """The rule of one (nvidia-modelopt, megatron-core) pair."""

    label: str
    specifier: str  # PEP 440 for nvidia-modelopt (pre-releases included)
    layout: str  # SHARED | PER_EXPERT
    # replica_id rule of the per-expert weight-quantizer amax (harness/topology/oracle.py:
    # "dense-tp" | "expert-tp"); None: the layout has no per-expert amax, so nothing can collide.
    replica_rule: str | None
    # The second bug: load_state_dict re-calibrates a GroupedQuantizer through expert 0 only,
    # so a load rank holding several experts loses every other expert's amax.
    drops_expert_amax_on_reload: bool
    golden_restore: dict[str, str] = field(default_factory=dict)  # golden layout -> outcome
    fix_applies: bool = False  # harness.fix (written against 0.47.0's private methods)
    # The parts of harness.fix that exist for this pair although the whole fix does not
    # (0.48.0rc1 has parts a-e itself, and part (f) from moe_ckpt_fix/modelopt_0_48_0rc1.py): a
    # patched cell whose scenario needs only these parts runs, the others are skipped.
    fix_parts_apply: tuple[str, ...] = ()
    # Its megatron quantization plugin imports transformer_engine unconditionally: on a
    # machine without TE the plugin is silently absent, so cpu-tier quantization means nothing.
    plugin_needs_te: bool = False
    source: str = ""
    known: bool = True
    mcore: str = MCORE_GROUPS_ERA  # PEP 440 for megatron-core; "||" separates alternatives
    # replica_id rule of a grouped linear's SHARED input_quantizer amax (one key per pp stage,
    # oracle.shared_collisions): "dense-tp-dense-dp" (unique) or "expert-tp-dense-dp" (under
    # megatron-core < 0.16's decorator: collides whenever TP > ETP).
    shared_rule: str = "dense-tp-dense-dp"
    # Every TEGroupedMLP sharded_state_dict call raises this (save, and a load's request alike):
    # the pair cannot save at all. None: it can.
    cannot_save: str | None = None
    checked_on: str = ""  # where the rule was checked (tier and run), "" = source reading only
    # Rules per amax kind of the expert weights (harness/check/recipes.py); a kind not listed has
    # no rule for this pair: its cells are rule-unknown. Empty: the scalar kind only, by the
    # fields above (the kind every rule was first written for).
    kinds: dict[str, KindRule] = field(default_factory=dict)
    # Rules per amax kind of the dense families (shared experts, every other linear).
    dense_kinds: dict[str, KindRule] = field(default_factory=lambda: {SCALAR: dense_scalar_rule()})
    # Rules per amax kind of the routed experts under the fix's opt-in part (f), for a cell whose
    # ranks installed it (``kind_rule``'s ``fix_parts``); a kind not listed keeps ``kinds``'.
    fixed_kinds: dict[str, KindRule] = field(default_factory=dict)
    # A GroupedQuantizer's members keep their amax through modelopt_post_restore's reset (0.48.0rc1
    # plugins/custom.py:180-186): the restore's dry run (RESTORE_DRY_RUN) reads what torch.empty
    # made. 0.47.0 resets them (custom.py:177-181), unless the fix's part (b) is installed.
    members_keep_amax: bool = False

    def kind_rule(self, kind: str | None, family: str = EXPERTS,
                  fix_parts: tuple[str, ...] | list[str] = ()) -> KindRule | None:
        """This pair's rule for an amax kind of a module family; None: no rule. ``fix_parts``:
        the parts of harness.fix the cell's ranks installed (the scenario's ask before they ran);
        with part (f) among them, the routed experts' ``fixed_kinds`` rule."""
        if not self.known:
            return None
        if family != EXPERTS:
            return self.dense_kinds.get(kind or "")
        if STATIC_BLOCK_PART in fix_parts and kind in self.fixed_kinds:
            return self.fixed_kinds[kind]
        if kind == SCALAR and SCALAR not in self.kinds:
            return scalar_rule(self.drops_expert_amax_on_reload)
        rule = self.kinds.get(kind or "")
        if rule is None or kind not in DRY_RUN_KINDS:
            return rule
        defect = RESTORE_DRY_RUN if self.restore_dry_run(fix_parts) else None
        return rule if rule.restore_defect is defect else replace(rule, restore_defect=defect)

    def restore_dry_run(self, fix_parts: tuple[str, ...] | list[str] = ()) -> bool:
        """Whether the routed experts' integer amax meet RESTORE_DRY_RUN under the fix's
        ``fix_parts`` (none: unpatched): the members keep an amax through the reset (the release's
        own, or the fix's part (b)) and part (g) is not installed."""
        keeps = self.members_keep_amax or EXPERT_AMAX_PART in fix_parts
        return keeps and UNLOADED_AMAX_PART not in fix_parts

    def fix_runs(self, parts: tuple[str, ...] | list[str] = ()) -> bool:
        """Whether harness.fix patches this pair for a scenario needing ``parts``: the whole fix,
        or only parts the release lacks (``fix_parts_apply``) when the scenario needs no other."""
        return self.fix_applies or bool(parts) and set(parts) <= set(self.fix_parts_apply)

    def fix_parts_only(self, parts: tuple[str, ...] | list[str] = ()) -> bool:
        """The fix runs for ``parts`` on a release that has the rest itself: a patched pipeline is
        then judged on the fix cells alone (harness/report/verdict.py judge)."""
        return not self.fix_applies and self.fix_runs(parts)

    def matches(self, version: str, mcore: str | None = None) -> bool:
        return (SpecifierSet(self.specifier, prereleases=True).contains(version)
                and in_band(self.mcore, mcore or REFERENCE_MCORE))

    def covers_mcore(self, mcore: str) -> bool:
        """Whether this rule holds for megatron-core ``mcore`` (any nvidia-modelopt it covers)."""
        return in_band(self.mcore, mcore)

    def covers_modelopt(self, version: str | None) -> bool:
        try:
            return SpecifierSet(self.specifier, prereleases=True).contains(version or "")
        except InvalidVersion:
            return False

    def notice(self, version: str | None, mcore: str | None = None) -> str | None:
        """One line for reports when the pair has no rule of its own."""
        if self.known:
            return None
        return (f"(nvidia-modelopt {version}, megatron-core {mcore or installed_mcore()}): rule "
                "unknown (harness/check/versions.py has no rule for this pair); its cells are "
                "judged `rule-unknown` (what ran is recorded, nothing is predicted); read both "
                "packages' sources and add a rule")

    def failure_kind(self, topo_fails_expert: bool, topo_fails_shared: bool) -> str | None:
        """What a failing save under this pair's rule raises, in words (for records)."""
        if self.cannot_save:
            return self.cannot_save
        if topo_fails_expert:
            return "CheckpointingException on a per-expert weight_quantizer._amax"
        if topo_fails_shared:
            return "CheckpointingException on a grouped linear's shared input_quantizer._amax"
        return None


def _expert_kinds(lost_on_reload: bool, source: str, restore_dry_run: bool = False) -> dict[str, KindRule]:
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


_DENSE_WITH_STATIC = {SCALAR: dense_scalar_rule(), STATIC_BLOCK: dense_static_block_rule(),
                      PER_CHANNEL: dense_per_channel_rule(), PER_BLOCK: dense_per_block_rule(),
                      NO_AMAX: no_amax_rule()}
_GOLDENS_PER_EXPERT = {GoldenLayout.SHARED: NOT_RESTORED, GoldenLayout.COMPLETE: RESTORED,
                       GoldenLayout.INCOMPLETE: NOT_RESTORED}
_SRC_047 = ("0.47.0 plugins/megatron.py:936 make_sharded_tensors_for_checkpoint(expert_state, '', "
            "expert_axis, new_sharded_offsets) with no groups, then :944-946 replica_id[2] := "
            "expert-DP rank; :906 shared buffers the same way; plugins/custom.py "
            "modelopt_post_restore resets and re-calibrates the GroupedQuantizer")
_EXPERT_ENTRIES_048 = (
    "0.48.0rc1 plugins/megatron.py:983-989 builds every weight_quantizer.{i}.* with "
    "tp_group=expt_tp_group, dp_cp_group=expt_dp_group: replicated entries get (0, etp rank, edp), "
    "cut ones offsets over expert TP: the expert-TP rule, no collision")
_SRC_048 = ("0.48.0rc1 plugins/megatron.py:982-989 make_sharded_tensors_for_checkpoint(..., "
            "tp_group=expt_tp_group, dp_cp_group=expt_dp_group) (groups from "
            "_expert_parallel_groups :886-895); shared buffers with the defaults (:967-971); "
            "plugins/custom.py skips GroupedQuantizer in modelopt_post_restore")
KNOWN = (
    Behaviour(
        label="0.46.x", specifier="<0.47.0", layout=SHARED, replica_rule=None,
        drops_expert_amax_on_reload=False,
        golden_restore={GoldenLayout.SHARED: RESTORED, GoldenLayout.COMPLETE: NOT_RESTORED,
                        GoldenLayout.INCOMPLETE: NOT_RESTORED},
        source="0.46.1 plugins/transformer_engine.py: one weight_quantizer per grouped linear "
               "(no per-expert amax keys); a per-expert checkpoint's keys do not exist there",
        checked_on="gpu-shared with megatron-core 0.19.2 (docs/runs/20261202-204604-matrix.md)",
    ),
    Behaviour(
        label="0.47.0 + mcore 0.16.x|0.19.2", specifier="==0.47.0", layout=PER_EXPERT,
        replica_rule="dense-tp", drops_expert_amax_on_reload=True,
        golden_restore=_GOLDENS_PER_EXPERT, fix_applies=True,
        kinds=_expert_kinds(True, _EXPERT_ENTRIES_047 + "; " + _SECOND_BUG_047),
        dense_kinds=_DENSE_WITH_STATIC,
        fixed_kinds={STATIC_BLOCK: fixed_static_block_rule()},
        source=f"{_SRC_047}; megatron-core >= 0.16 fills replica_id[1] from the DENSE TP group "
               "(0.16.1 core/utils.py:1017-1020; 0.19.2 the same)",
        checked_on="gpu-shared with megatron-core 0.19.2 (docs/runs/20261202-122731-witness.md) "
                   "and 0.16.1 (docs/runs/20261204-0203-pairs.md); cpu-tier real validation (tests/test_oracle_vs_megatron.py)",
    ),
    Behaviour(
        label="0.47.0 + mcore 0.15", specifier="==0.47.0", mcore=MCORE_DECORATOR_ERA,
        layout=PER_EXPERT, replica_rule="expert-tp", shared_rule="expert-tp-dense-dp",
        drops_expert_amax_on_reload=True, golden_restore=_GOLDENS_PER_EXPERT,
        source=f"{_SRC_047}; under megatron-core 0.15's expert_dist_ckpt_decorator (0.15.3 "
               "moe/experts.py:62-94 on TEGroupedMLP.sharded_state_dict :965) "
               "get_tensor_model_parallel_rank() is the EXPERT-TP rank (0.15.3 "
               "parallel_state.py:1509-1514): per-expert amax get (0, etp, edp), no collision; "
               "but the shared input_quantizer._amax keeps the DENSE DP rank (0.15.3 "
               "utils.py:845-856): (0, etp, dp) collides whenever TP > ETP",
        checked_on="gpu-shared with megatron-core 0.15.3 (docs/runs/20261204-0203-pairs.md: the shared input amax key "
                   "refused, the TP < ETP load loads and loses 28/32 expert amax); cpu-tier real "
                   "validation (tests/test_oracle_vs_megatron.py)",
    ),
    Behaviour(
        label="0.48.0rc1 + mcore 0.16.x|0.19.2", specifier="==0.48.0rc1", layout=PER_EXPERT,
        replica_rule="expert-tp", drops_expert_amax_on_reload=False,
        golden_restore=_GOLDENS_PER_EXPERT, plugin_needs_te=True,
        kinds=_expert_kinds(False, _EXPERT_ENTRIES_048 + "; " + _NO_SECOND_BUG_048, restore_dry_run=True),
        members_keep_amax=True,  # custom.py:180-186: RESTORE_DRY_RUN for its integer expert kinds
        dense_kinds=_DENSE_WITH_STATIC,
        # the fix has only part (f) for 0.48.0rc1: a patched cell whose scenario needs (f) runs,
        # one that needs the whole fix is skipped
        fix_parts_apply=PARTS_ONLY_VERSIONS["0.48.0rc1"],
        fixed_kinds={STATIC_BLOCK: fixed_static_block_rule()},
        source=_SRC_048 + "; megatron-core >= 0.16 honours the groups (0.16.1 "
               "transformer/utils.py:81-82, core/utils.py:1009-1020)",
        checked_on="gpu-shared with megatron-core 0.19.2 (docs/runs/20261203-000204-matrix.md) "
                   "and 0.16.1 (docs/runs/20261204-0203-pairs.md)",
    ),
    Behaviour(
        label="0.48.0rc1 + mcore 0.15", specifier="==0.48.0rc1", mcore=MCORE_DECORATOR_ERA,
        layout=PER_EXPERT, replica_rule="expert-tp", shared_rule="expert-tp-dense-dp",
        drops_expert_amax_on_reload=False, golden_restore=_GOLDENS_PER_EXPERT,
        plugin_needs_te=True, members_keep_amax=True,
        cannot_save="TypeError: make_sharded_tensors_for_checkpoint() got an unexpected keyword "
                    "argument 'tp_group'",
        source=_SRC_048 + "; megatron-core 0.15.3 transformer/utils.py:76-82 has no tp_group "
               "parameter, so every TEGroupedMLP sharded_state_dict (save, and a load's request) "
               "raises TypeError",
        checked_on="gpu-shared with megatron-core 0.15.3 (docs/runs/20261204-0203-pairs.md: "
                   "every save raises the TypeError)",
    ),
)
LAST_BUGGY = "0.47.0"
DEFAULT_MATRIX = ("0.46.1", "0.47.0", "0.48.0rc1")  # `make matrix` without MODELOPT=
DEFAULT_MCORE_MATRIX = (REFERENCE_MCORE,)  # `make matrix` without MCORE=
# One megatron-core release per band whose sources were read (harness/golden/forecast.py pairs).
READ_MCORE = ("0.15.3", "0.16.1", "0.19.2")


UNKNOWN = Behaviour(
    label="rule unknown", specifier="", layout=PER_EXPERT, replica_rule=None,
    drops_expert_amax_on_reload=False, known=False, mcore="",
    source="no rule for this (nvidia-modelopt, megatron-core) pair: nothing is predicted",
)


@functools.lru_cache(maxsize=None)
def rules_for(modelopt: str | None, mcore: str | None) -> Behaviour:
    """The rule of a (nvidia-modelopt, megatron-core) pair; UNKNOWN for a pair not listed."""
    try:
        Version(modelopt or "")
        Version(mcore or "")
    except InvalidVersion:
        return UNKNOWN
    return next((b for b in KNOWN if b.matches(modelopt, mcore)), UNKNOWN)


def behaviour_for(version: str | None, mcore: str | None = None) -> Behaviour:
    """The rule of ``version`` with ``mcore`` (default: the megatron-core installed here)."""
    return rules_for(version, mcore or installed_mcore())


@functools.cache
def _installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, once per process: it does not change while one
    runs, and checking the scenarios asks for it per scenario (276 look-ups, 0.25 s of every
    ``verdict``)."""
    import importlib.metadata as md

    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def installed_mcore() -> str | None:
    return _installed("megatron-core")


def installed_modelopt() -> str | None:
    return _installed("nvidia-modelopt")


@functools.lru_cache(maxsize=None)
def plugin_problem() -> str | None:
    """Why ModelOpt's megatron quantization plugin is unusable here, or None.

    modelopt imports its plugins under ``import_plugin``, which swallows ModuleNotFoundError:
    a missing plugin is silent, and quantizing a megatron model then quietly does less.
    """
    try:
        import modelopt.torch.quantization.plugins.megatron  # noqa: F401
    except ModuleNotFoundError as exc:
        return (f"nvidia-modelopt {installed_modelopt()}'s megatron quantization plugin needs "
                f"{exc.name or 'a missing module'} ({exc}); this machine has no Transformer "
                "Engine, so the cpu tier cannot exercise this version")
    except Exception as exc:  # noqa: BLE001  (TE's meta package raises RuntimeError on CPU)
        return (f"nvidia-modelopt {installed_modelopt()}'s megatron quantization plugin does "
                f"not import: {type(exc).__name__}: {str(exc)[:160]}")
    return None
