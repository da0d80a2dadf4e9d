"""What ``python -m harness repair SRC DST`` writes, decided from SRC's metadata alone (storage
checked, no tensor read; ``--dry-run`` prints it):

* every per-expert ``...experts.<e>.<linear>.weight_quantizer._amax`` the checkpoint lacks is
  written, by the rules of harness/check/expect.py (one place): from the grouped linear's shared
  amax (what ModelOpt <= 0.46 applied to every expert of the grouped linear, moe_ckpt_fix/
  legacy_load.py (d)/(e)), else ``max|W_e|`` of the expert's whole saved weight (all its TP
  shards: the checkpoint holds the global tensor), what max calibration stores;
* the shared amax keys are dropped (no per-expert model asks for them);
* shared layout only: each expert linear's ``_extra_state`` names ONE ``weight_quantizer``;
  0.47.0 / 0.48.0rc1 ``set_extra_state`` look for ``weight_quantizer.<i>`` and fall back to
  ``weight_quantizer.0`` (0.48.0rc1 plugins/megatron.py:297-307, 0.47.0 :255-266), never to the
  bare name, so without a rewrite no expert quantizer gets an ``_amax`` buffer and the amax
  written above would not even be requested. The entry is renamed ``weight_quantizer.0`` (its
  content, the quantizer config, is unchanged: 0.46.1 and 0.47.0 write the same fields);
* everything else is copied: tensors value for value (sha256 of each tensor's bytes checked
  after writing), ``_extra_state``/common objects byte for byte, and every other file
  (``metadata.json``, ``common.pt``, ``modelopt_state/``: its common state holds only the
  quantize config and ModelOpt version, no per-quantizer state, so it needs no rewrite).

Why apart from the writing (harness/golden/repair.py): the plan is the part the rules of
harness/check/expect.py decide and a reviewer checks; streaming, verifying and renaming DST into
place are how it is carried out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.check.expect import FROM_LEGACY, amax_dtype_of, derived_amax_sources
from harness.check.keys import EXPERT_WEIGHT, SHARED_WEIGHT_AMAX, WEIGHT_AMAX_SUFFIX
from harness.check.layouts import CkptLayout
from harness.golden.layout import inspect_checkpoint
from harness.golden.storage import torch_metadata

# "<prefix>.experts.experts.<e>.<linear>._extra_state/shard_..." of a TEGroupedMLP expert linear
_EXPERT_EXTRA_STATE = re.compile(
    r"^(?P<prefix>(?:.*\.)?layers\.\d+\.mlp\.experts(?:\.experts)?)\.(?P<expert>\d+)\."
    r"(?P<linear>linear_fc\d)\._extra_state(?:/.*)?$")


class RepairError(Exception):
    """The checkpoint cannot be repaired, or DST cannot be written (one line, names the file)."""


class NothingToRepair(Exception):
    """SRC already loads complete on per-expert releases: no DST is written. Not an error (exit 0)."""


@dataclass
class Plan:
    src: Path
    dst: Path
    kind: str
    derived: dict[str, tuple[str, str]]  # new amax key -> (FROM_LEGACY | MAX_CALIBRATED, source)
    dropped: list[str]  # shared amax keys not carried over
    copied: list[str]  # tensor keys copied as they are
    rewritten_objects: list[str]  # _extra_state objects whose weight_quantizer entry is renamed
    copied_objects: list[str]
    files: list[str]  # other files and folders copied byte for byte
    amax_dtype: object = None
    src_bytes: int = 0
    hashes: dict[str, str] = field(default_factory=dict)  # tensor key -> sha256 (SRC, then checked in DST)

    @property
    def needs_nothing(self) -> bool:
        """No amax to write, no shared amax to drop, no ``_extra_state`` to rename."""
        return not (self.derived or self.dropped or self.rewritten_objects)

    def nothing_line(self) -> str:
        present = sum(1 for k in self.copied if k.endswith(WEIGHT_AMAX_SUFFIX)
                      and EXPERT_WEIGHT.match(k[: -len("_quantizer._amax")]))
        return (f"nothing to repair: {self.src} already holds every expert's weight-quantizer amax "
                f"(layout {self.kind}, {present} present); {self.dst} not written")

    def summary(self) -> dict:
        legacy = sum(1 for how, _ in self.derived.values() if how == FROM_LEGACY)
        return {"src": str(self.src), "dst": str(self.dst), "layout": self.kind,
                "expert_amax_from_shared": legacy, "expert_amax_max_calibrated": len(self.derived) - legacy,
                "shared_amax_dropped": len(self.dropped), "tensors_copied": len(self.copied),
                "extra_states_rewritten": len(self.rewritten_objects),
                "objects_copied": len(self.copied_objects), "files_copied": self.files}

    def render(self) -> str:
        s = self.summary()
        lines = [f"repair {self.src} -> {self.dst} (layout {self.kind})",
                 f"  write {s['expert_amax_from_shared']} per-expert amax from the shared amax, "
                 f"{s['expert_amax_max_calibrated']} by max calibration (max|W| of the expert's weight)",
                 f"  drop {s['shared_amax_dropped']} shared amax; rename weight_quantizer -> "
                 f"weight_quantizer.0 in {s['extra_states_rewritten']} _extra_state objects",
                 f"  copy {s['tensors_copied']} tensors, {s['objects_copied']} objects, files: "
                 + (", ".join(self.files) or "none")]
        by_linear: dict[str, list[int]] = {}
        for key, (how, _) in self.derived.items():
            m = EXPERT_WEIGHT.match(key[: -len("_quantizer._amax")])
            by_linear.setdefault(f"{m['prefix']}.{m['name']} ({'shared' if how == FROM_LEGACY else 'max|W|'})",
                                 []).append(int(m["expert"]))
        for lin, experts in sorted(by_linear.items()):
            lines.append(f"    {lin}: experts {_ranges(sorted(experts))}")
        return "\n".join(lines)


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def plan_repair(src: Path | str, dst: Path | str) -> Plan:
    """What ``repair`` would write, from SRC's metadata only (storage checked, no tensor read)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    src, dst = Path(src), Path(dst)
    lay = inspect_checkpoint(src)  # NotACheckpoint / DamagedCheckpoint: one line
    if lay.backend != "torch_dist":
        raise RepairError(f"{src}: backend {lay.backend}; repair writes torch_dist checkpoints only")
    if lay.kind in (CkptLayout.MIXED, CkptLayout.UNQUANTIZED, CkptLayout.INCOMPLETE):
        raise RepairError(f"{src}: layout {lay.kind}: nothing repair can derive safely "
                          "(needs a shared amax or some per-expert amax per grouped linear)")
    md = torch_metadata(src)
    tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    # Only linears that hold weight amax in some form (shared, or some experts): an expert
    # weight of an unquantized linear gets nothing.
    quantized = set()
    for key in tensors:
        if m := SHARED_WEIGHT_AMAX.match(key):
            quantized.add(key[: -len("." + WEIGHT_AMAX_SUFFIX)])
        elif key.endswith(WEIGHT_AMAX_SUFFIX) and (m := EXPERT_WEIGHT.match(key[: -len("_quantizer._amax")])):
            quantized.add(f"{m['prefix']}.{m['name']}")
    derived = {}
    for amax_key, (how, source) in derived_amax_sources(tensors).items():
        m = EXPERT_WEIGHT.match(amax_key[: -len("_quantizer._amax")])
        if f"{m['prefix']}.{m['name']}" in quantized:
            derived[amax_key] = (how, source)
    for key in {s for how, s in derived.values() if how == FROM_LEGACY}:
        if tuple(tensors[key].size) != (1,):
            raise RepairError(f"{src}: {key} has shape {tuple(tensors[key].size)}: only a per-tensor "
                              "amax can be shared by the experts")
    dropped = sorted(k for k in tensors if SHARED_WEIGHT_AMAX.match(k))
    amax_dtype = amax_dtype_of(v.properties.dtype for k, v in tensors.items() if k.endswith(WEIGHT_AMAX_SUFFIX))
    objects = sorted(k for k in md.state_dict_metadata if k not in tensors)
    shared_linears = {k[: -len("." + WEIGHT_AMAX_SUFFIX)] for k in dropped}
    rewritten = [k for k in objects if (m := _EXPERT_EXTRA_STATE.match(k))
                 and f"{m['prefix']}.{m['linear']}" in shared_linears]
    files = sorted(p.name for p in src.iterdir()
                   if p.name != ".metadata" and not p.name.endswith(".distcp"))
    size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    return Plan(src=src, dst=dst, kind=lay.kind, derived=derived, dropped=dropped,
                copied=sorted(k for k in tensors if k not in dropped),
                rewritten_objects=rewritten, copied_objects=[k for k in objects if k not in set(rewritten)],
                files=files, amax_dtype=amax_dtype, src_bytes=size)
