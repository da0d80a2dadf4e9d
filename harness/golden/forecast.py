"""What each (nvidia-modelopt, megatron-core) pair the harness knows does with an existing checkpoint.

Why: a job holding an old checkpoint must know, before it starts, whether the release it moves
to loads it complete, loads it with some expert amax silently gone, or refuses it. The rule per
release is the ``golden_restore`` of harness/check/versions.py (read there from each release's
sources and checked by the GPU golden runs); this module only turns a checkpoint's layout
(harness/golden/layout.py) into that rule's key and says how a ``not-restored`` shows:

* shared (<= 0.46.x) checkpoint, per-expert release: ``set_extra_state`` finds no
  ``weight_quantizer.<i>`` entry (only ``weight_quantizer``) and skips it (0.48.0rc1
  plugins/megatron.py:297-307; 0.47.0 :255-266), so no expert quantizer gets an ``_amax`` buffer,
  none is asked of the checkpoint, and the load succeeds with every expert amax absent
  (measured: 32/32 absent under 0.47.0 and 0.48.0rc1, docs/runs/20261202-150543-golden.md,
  20261202-204604-matrix.md);
* per-expert checkpoint with experts missing, per-expert release: the model asks for amax keys
  the checkpoint lacks, and torch DCP refuses the load (``CheckpointException``, missing key;
  measured under 0.48.0rc1, docs/runs/20261203-000204-matrix.md);
* per-expert checkpoint, shared-layout release (0.46.x): its model asks for the shared key the
  checkpoint lacks: refused the same way.

``forecast(layout, rules)`` takes the rules as an argument; ``pairs()`` gives every
(modelopt, megatron-core) pair versions.py has a rule for, one megatron-core per band read.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from harness.check import versions
from harness.check.defects import COMMON_PT, common_pt_problem
from moe_ckpt_fix.releases import READ_MCORE, REFERENCE_MCORE
from harness.check.layouts import CkptLayout, GoldenLayout, golden_layout_of

# megatron-core releases every golden rule was measured with on a GPU (docs/runs/*golden*,
# *matrix*); the other pairs' golden rules are read from the sources (versions.py).
MEASURED_MEGATRON_CORE = (REFERENCE_MCORE,)
LOADS_COMPLETE, LOADS_ABSENT, REFUSED = "loads-complete", "loads-amax-absent", "refused"
DEPENDS, NOT_MOE = "depends-on-load-topology", "n/a"


@dataclass(frozen=True)
class Forecast:
    modelopt: str
    megatron_core: str
    outcome: str  # LOADS_COMPLETE | LOADS_ABSENT | REFUSED | DEPENDS | NOT_MOE
    absent: int  # expert amax that end up missing (silently, or the reason for the refusal)
    line: str  # what a person reads
    caveat: str = ""
    repairable: bool = False  # `python -m harness repair` makes this release load it complete
    remedy: str = ""  # what to do first (the command)

    def as_json(self) -> dict:
        return asdict(self)


def expert_amax_count(lay) -> int:
    """Per-expert weight amax a per-expert model asks for: experts x grouped linears."""
    if lay.kind == CkptLayout.SHARED:
        return len(lay.shared_keys) * (lay.num_experts or 0)
    return sum(len(li.present) + len(li.missing) for li in lay.linears)


def pairs():
    """[(rule label, megatron-core, Behaviour)] for every pair versions.py has a rule for."""
    return [(b.label.split(" + ")[0], mc, b) for b in versions.KNOWN for mc in READ_MCORE
            if b.covers_mcore(mc)]  # the modelopt part of the label: the pair names mc itself


REPAIR = "python -m harness repair OLD_CKPT NEW_CKPT, then load NEW_CKPT"
WITH_FIX = "load it with harness.fix (MOE_CKPT_FIX=1, README 'Using the fix')"
NEWER_FORMAT = ("load it with a megatron-core that reads it (the one that wrote it, e.g. 0.19.2); "
                "repair does not change the format")
NO_WAY_BACK = "keep a per-expert release (0.47.0 + harness.fix, or 0.48.0rc1); repair cannot go back"


def forecast_one(lay, label: str, megatron_core: str, behaviour) -> Forecast:
    f = _outcome(lay, label, megatron_core, behaviour)
    buggy = behaviour.replica_rule == "dense-tp" or behaviour.drops_expert_amax_on_reload
    if f.outcome == REFUSED and not behaviour.cannot_save and unreadable(lay, megatron_core):
        remedy = NEWER_FORMAT
    elif f.outcome in (LOADS_COMPLETE, NOT_MOE):
        remedy = "nothing to do" if f.outcome == LOADS_COMPLETE else ""
    elif behaviour.layout == versions.SHARED:
        remedy = NO_WAY_BACK
    elif behaviour.cannot_save:
        remedy = "move to megatron-core >= 0.16 (0.48.0rc1 cannot build a checkpoint request here)"
    elif buggy:  # a repaired checkpoint is per-expert: this release still mishandles those
        remedy = WITH_FIX if behaviour.fix_applies else (
            "move to a fixed release (0.48.0rc1) with megatron-core >= 0.16")
    else:
        remedy = REPAIR
    return dataclasses.replace(f, repairable=remedy == REPAIR, remedy=remedy)


def unreadable(lay, megatron_core: str) -> bool:
    """The checkpoint on disk has no common.pt and this megatron-core needs one (versions.py
    NEEDS_COMMON_PT); a layout not read from disk (``has_common_pt`` None) is never."""
    return lay.has_common_pt is False and common_pt_problem(lay.path, megatron_core) is not None


def _outcome(lay, label: str, megatron_core: str, behaviour) -> Forecast:
    key = golden_layout_of(lay)
    total = expert_amax_count(lay)
    if key is None:
        return Forecast(label, megatron_core, NOT_MOE, 0,
                        f"no rule for a {lay.kind} checkpoint (no per-expert weight-quantizer state)")
    if behaviour.cannot_save:  # every load builds a sharded_state_dict request: it raises
        return Forecast(label, megatron_core, REFUSED, total, f"refused: {behaviour.cannot_save}")
    # the request is built before any file is read: a TypeError above comes first
    if unreadable(lay, megatron_core):
        return Forecast(label, megatron_core, REFUSED, total,
                        f"refused: no {COMMON_PT} (megatron-core {megatron_core} reads "
                        "only checkpoints written by megatron-core <= 0.16; this one was written "
                        "by a newer one)")
    if (behaviour.layout == versions.PER_EXPERT and key != GoldenLayout.SHARED
            and behaviour.shared_rule == "expert-tp-dense-dp"):
        # 0.47.0 on megatron-core 0.15 (versions.py): per-expert amax do not collide, the
        # shared input amax does at TP > ETP; the second bug is the same.
        return Forecast(label, megatron_core, DEPENDS, total,
                        "depends on the load topology: refused at TP > ETP (CheckpointingException: "
                        "Invalid access pattern on the shared ...experts.linear_fcN.input_quantizer."
                        "_amax); elsewhere only each rank's first local expert keeps its amax")
    if behaviour.layout == versions.PER_EXPERT and key != GoldenLayout.SHARED and (
            behaviour.replica_rule == "dense-tp" or behaviour.drops_expert_amax_on_reload):
        # 0.47.0: a per-expert checkpoint's fate depends on the load topology (measured,
        # docs/runs/20261202-150543-golden.md): the collision refuses TP != ETP loads, and the
        # second bug keeps only each rank's first local expert's amax.
        return Forecast(label, megatron_core, DEPENDS, total,
                        "depends on the load topology: refused at TP != ETP (CheckpointException: "
                        "Invalid access pattern, replica-id collision); elsewhere only each rank's "
                        "first local expert keeps its amax (e.g. 28 of 32 lost at one rank)",
                        "harness.fix loads it complete")
    if behaviour.golden_restore.get(key) == versions.RESTORED:
        if key == GoldenLayout.SHARED:
            return Forecast(label, megatron_core, LOADS_COMPLETE, 0,
                            f"loads complete (the layout it wrote: {len(lay.shared_keys)} shared amax)")
        return Forecast(label, megatron_core, LOADS_COMPLETE, 0,
                        f"loads complete ({total} expert amax restored)")
    caveat = ""
    if key == GoldenLayout.SHARED and behaviour.layout == versions.PER_EXPERT:
        if behaviour.fix_applies:
            caveat = "harness.fix loads it complete (the shared amax goes to every expert)"
        return Forecast(label, megatron_core, LOADS_ABSENT, total,
                        f"loads with {total} expert amax silently absent (the shared "
                        "weight_quantizer state is skipped; no error)", caveat)
    if behaviour.layout == versions.SHARED:
        return Forecast(label, megatron_core, REFUSED, total,
                        "refused: CheckpointException (missing key: this release asks for the "
                        "shared ...experts.<linear>.weight_quantizer._amax)", caveat)
    missing = sum(len(v) for v in lay.missing.values()) if lay.kind == CkptLayout.PER_EXPERT else total
    return Forecast(label, megatron_core, REFUSED, missing,
                    f"refused: CheckpointException (missing key: {missing} expert "
                    "weight_quantizer._amax not in the checkpoint)", caveat)


def forecast(lay, rules=None) -> list[Forecast]:
    """One Forecast per (modelopt, megatron-core) pair of ``rules`` (default: ``pairs()``)."""
    return [forecast_one(lay, label, mc, b) for label, mc, b in (rules or pairs())]


def render(fcs: list[Forecast]) -> str:
    lines = ["forecast (unpatched):"]
    for f in fcs:
        lines.append(f"  modelopt {f.modelopt} + megatron-core {f.megatron_core}: {f.line}")
        if f.caveat:
            lines.append(f"      note: {f.caveat}")
    for f in fcs:
        if f.remedy and f.remedy != "nothing to do":
            lines.append(f"  with modelopt {f.modelopt} + megatron-core {f.megatron_core}: {f.remedy}")
    return "\n".join(lines)


# The kinds of checkpoint the jobs may hold, each pinned by a committed golden (tests/golden).
EXAMPLES = (("0.46.x checkpoint (one shared amax per grouped linear)", "modelopt-0.46.1-tp1-etp1-ep8"),
            ("0.47.0 checkpoint saved at TP == ETP", "modelopt-0.47.0-tp1-etp1-ep8"),
            ("0.47.0 checkpoint saved at TP != ETP, validation off", "modelopt-0.47.0-tp2-etp1-ep2-novalidate"))


def advice(modelopt_version: str | None, golden_root=None) -> list[str]:
    """Verdict lines: per kind of existing checkpoint, what this release does with it and the
    command to run first (``python -m harness inspect CKPT`` says which kind a job holds)."""
    from harness.golden.layout import inspect_checkpoint
    from harness.golden.storage import NotACheckpoint
    from harness.paths import GOLDEN_DIR

    root = golden_root or GOLDEN_DIR
    rules = [r for r in pairs() if r[2].covers_modelopt(modelopt_version)]
    if not rules:
        b = versions.rules_for(modelopt_version, versions.installed_mcore())
        rules = [(b.label, versions.installed_mcore() or MEASURED_MEGATRON_CORE[0], b)]
    lines = [f"    existing checkpoints under modelopt {modelopt_version} (every job; `python -m "
             "harness inspect CKPT` says which kind yours is):"]
    for what, golden in EXAMPLES:
        try:
            # the kind, not the file: a job's own checkpoint is in its megatron-core's format
            lay = dataclasses.replace(inspect_checkpoint(root / golden / "ckpt"), has_common_pt=None)
        except NotACheckpoint as exc:
            lines.append(f"      {what}: no example ({exc})")
            continue
        for f in forecast(lay, rules):
            lines.append(f"      {what} + megatron-core {f.megatron_core}: {f.line} -> {f.remedy}")
    return lines
