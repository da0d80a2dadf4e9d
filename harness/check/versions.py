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
from dataclasses import dataclass, field, replace

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.check.defects import DRY_RUN_KINDS, in_band
from harness.check.kinds import (DENSE_WITH_STATIC, KindRule, expert_kinds, dense_scalar_rule,
                                 fixed_static_block_rule, scalar_rule)
from harness.check.layouts import CkptLayout, GoldenLayout, Restore
from harness.model.recipes import EXPERTS, SCALAR, STATIC_BLOCK
from moe_ckpt_fix.parts import EXPERT_AMAX_PART, PARTS_ONLY_VERSIONS, STATIC_BLOCK_PART, UNLOADED_AMAX_PART
from moe_ckpt_fix.releases import (FIRST_FIXED, LAST_BUGGY, MCORE_DECORATOR_ERA, MCORE_GROUPS_ERA,
                                   REFERENCE_MCORE, SHARED_LAYOUT_RELEASES, SHARED_SERIES)
# Named by the reasons the judge writes into records ("harness/check/versions.py RESTORE_DRY_RUN",
# "... MODEL_DEFECTS", "... KindRule.reshard"): their homes are defects.py and kinds.py.
from harness.check.defects import MODEL_DEFECTS, RESTORE_DRY_RUN  # noqa: E402,F401

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
# The two bands: MCORE_DECORATOR_ERA and MCORE_GROUPS_ERA (moe_ckpt_fix/releases.py).


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
        label=SHARED_SERIES, specifier=SHARED_LAYOUT_RELEASES, layout=SHARED, replica_rule=None,
        drops_expert_amax_on_reload=False,
        golden_restore={GoldenLayout.SHARED: RESTORED, GoldenLayout.COMPLETE: NOT_RESTORED,
                        GoldenLayout.INCOMPLETE: NOT_RESTORED},
        source="0.46.1 plugins/transformer_engine.py: one weight_quantizer per grouped linear "
               "(no per-expert amax keys); a per-expert checkpoint's keys do not exist there",
        checked_on="gpu-shared with megatron-core 0.19.2 (docs/runs/20261202-204604-matrix.md)",
    ),
    Behaviour(
        label=f"{LAST_BUGGY} + mcore 0.16.x|{REFERENCE_MCORE}", specifier=f"=={LAST_BUGGY}", layout=PER_EXPERT,
        replica_rule="dense-tp", drops_expert_amax_on_reload=True,
        golden_restore=_GOLDENS_PER_EXPERT, fix_applies=True,
        kinds=expert_kinds(True, _EXPERT_ENTRIES_047 + "; " + _SECOND_BUG_047),
        dense_kinds=DENSE_WITH_STATIC,
        fixed_kinds={STATIC_BLOCK: fixed_static_block_rule()},
        source=f"{_SRC_047}; megatron-core >= 0.16 fills replica_id[1] from the DENSE TP group "
               "(0.16.1 core/utils.py:1017-1020; 0.19.2 the same)",
        checked_on="gpu-shared with megatron-core 0.19.2 (docs/runs/20261202-122731-witness.md) "
                   "and 0.16.1 (docs/runs/20261204-0203-pairs.md); cpu-tier real validation (tests/test_oracle_vs_megatron.py)",
    ),
    Behaviour(
        label=f"{LAST_BUGGY} + mcore 0.15", specifier=f"=={LAST_BUGGY}", mcore=MCORE_DECORATOR_ERA,
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
        label=f"{FIRST_FIXED} + mcore 0.16.x|{REFERENCE_MCORE}", specifier=f"=={FIRST_FIXED}", layout=PER_EXPERT,
        replica_rule="expert-tp", drops_expert_amax_on_reload=False,
        golden_restore=_GOLDENS_PER_EXPERT, plugin_needs_te=True,
        kinds=expert_kinds(False, _EXPERT_ENTRIES_048 + "; " + _NO_SECOND_BUG_048, restore_dry_run=True),
        members_keep_amax=True,  # custom.py:180-186: RESTORE_DRY_RUN for its integer expert kinds
        dense_kinds=DENSE_WITH_STATIC,
        # the fix has only part (f) for 0.48.0rc1: a patched cell whose scenario needs (f) runs,
        # one that needs the whole fix is skipped
        fix_parts_apply=PARTS_ONLY_VERSIONS[FIRST_FIXED],
        fixed_kinds={STATIC_BLOCK: fixed_static_block_rule()},
        source=_SRC_048 + "; megatron-core >= 0.16 honours the groups (0.16.1 "
               "transformer/utils.py:81-82, core/utils.py:1009-1020)",
        checked_on="gpu-shared with megatron-core 0.19.2 (docs/runs/20261203-000204-matrix.md) "
                   "and 0.16.1 (docs/runs/20261204-0203-pairs.md)",
    ),
    Behaviour(
        label=f"{FIRST_FIXED} + mcore 0.15", specifier=f"=={FIRST_FIXED}", mcore=MCORE_DECORATOR_ERA,
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


UNKNOWN = Behaviour(
    label="rule unknown", specifier="", layout=PER_EXPERT, replica_rule=None,
    drops_expert_amax_on_reload=False, known=False, mcore="",
    source="no rule for this (nvidia-modelopt, megatron-core) pair: nothing is predicted",
)


@functools.lru_cache(maxsize=None)
def rules_for(modelopt: str | None, mcore: str | None) -> Behaviour:
    """The rule of a (nvidia-modelopt, megatron-core) pair; UNKNOWN for a pair not listed (or a
    version that is None or no version). The one lookup of a pair's rules: the pair installed here
    is ``rules_for(installed_modelopt(), installed_mcore())``."""
    try:
        Version(modelopt or "")
        Version(mcore or "")
    except InvalidVersion:
        return UNKNOWN
    return next((b for b in KNOWN if b.matches(modelopt, mcore)), UNKNOWN)


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
