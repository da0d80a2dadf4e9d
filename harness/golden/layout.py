"""Which MoE weight-quantizer layout a checkpoint holds (``python -m harness inspect``: inspect.py).

Why: the resharding failure also hits checkpoints written by older ModelOpt releases, and the two
releases store the grouped-MLP weight quantizer differently. Before loading, a user needs to know
which layout the checkpoint holds and whether every expert's amax was actually written:
  * ``per-expert`` (ModelOpt 0.47.0): one ``...mlp.experts.experts.{E}.linear_fc{1,2}.
    weight_quantizer._amax`` per global expert. A checkpoint saved at TP != ETP with validation
    switched off can lack some experts' amax (no rank held a "main replica" of them): those are
    listed as missing.
  * ``shared`` (ModelOpt <= 0.46.x): one ``...mlp.experts[.experts].linear_fc{1,2}.
    weight_quantizer._amax`` per grouped linear, no expert id.
  * ``mixed``: both of the above (should not happen; reported rather than guessed).
  * ``incomplete``: the experts are quantized (input-quantizer amax present) but no expert
    weight-quantizer amax was written at all.
  * ``unquantized``: no quantizer state in the checkpoint.

Only metadata is read (harness/golden/storage.py), so it is quick on any machine.
"""
from __future__ import annotations

from collections import Counter
from math import prod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.check.keys import (ANY_LAYER, EXPERT_INPUT_AMAX, EXPERT_WEIGHT, PER_EXPERT_WEIGHT_AMAX,
                                ROUTER_WEIGHT, SHARED_WEIGHT_AMAX)
from harness.check.layouts import CkptLayout
from harness.check.recipes import SCALAR, STATIC_BLOCK
from harness.golden.storage import read_metadata


@dataclass
class LinearAmax:
    """Per-expert weight-quantizer amax of one grouped linear (one layer, fc1 or fc2)."""

    layer: int
    linear: str
    present: list[int]
    missing: list[int]


@dataclass
class Layout:
    path: str
    kind: str  # a CkptLayout
    backend: str
    num_tensors: int
    num_layers: int
    num_experts: int | None  # from the router (global experts), else from expert weights
    experts_seen: list[int]  # global expert ids with any tensor in the checkpoint
    dtypes: dict[str, int]  # dtype -> number of tensors
    amax_dtypes: list[str]  # dtypes of the expert weight-quantizer amax
    linears: list[LinearAmax] = field(default_factory=list)  # per-expert layout only
    shared_keys: list[str] = field(default_factory=list)  # shared layout only
    # megatron-core <= 0.16 needs it (harness/check/versions.py NEEDS_COMMON_PT); None: not a
    # checkpoint directory read from disk
    has_common_pt: bool | None = None
    # The amax kinds of the expert weight quantizers (harness/check/recipes.py words): scalar
    # (one value per expert), static-block (a per-block _amax with a _global_amax: a static
    # NVFP4 recipe such as the Ultra job's nvfp4-4o6).
    expert_amax_kinds: list[str] = field(default_factory=list)

    @property
    def missing(self) -> dict[str, list[int]]:
        """``layer.linear`` -> global experts without their weight-quantizer amax."""
        return {f"{li.layer}.{li.linear}": li.missing for li in self.linears if li.missing}

    def as_json(self) -> dict:
        d = asdict(self)
        d["missing"] = self.missing
        return d


def classify(tensors: dict[str, tuple[str, tuple[int, ...]]], path: str = "", backend: str = "") -> Layout:
    """Classify from ``key -> (dtype, global_shape)``; pure, so tests can feed recordings."""
    per_expert: dict[tuple[int, str], set[int]] = {}
    shared: list[str] = []
    amax_dtypes: set[str] = set()
    experts_seen: set[int] = set()
    routers: dict[int, int] = {}
    layers: set[int] = set()
    expert_input_amax = False
    grouped: set[tuple[int, str]] = set()  # (layer, linear) that exist in any form
    kinds: set[str] = set()
    for key, (dtype, shape) in tensors.items():
        if ".experts." in key and key.endswith("weight_quantizer._global_amax"):
            kinds.add(STATIC_BLOCK)
        if m := ANY_LAYER.match(key):
            layers.add(int(m["layer"]))
        if m := PER_EXPERT_WEIGHT_AMAX.match(key):
            layer, expert = int(m["layer"]), int(m["expert"])
            per_expert.setdefault((layer, m["linear"]), set()).add(expert)
            experts_seen.add(expert)
            amax_dtypes.add(dtype)
            kinds.add(SCALAR if prod(shape or (1,)) == 1 else STATIC_BLOCK)
        elif m := SHARED_WEIGHT_AMAX.match(key):
            shared.append(key)
            amax_dtypes.add(dtype)
            grouped.add((int(m["layer"]), m["linear"]))
        elif EXPERT_INPUT_AMAX.match(key):
            expert_input_amax = True
        if m := EXPERT_WEIGHT.match(key):
            experts_seen.add(int(m["expert"]))
            lin = key.rsplit(".", 2)[-2]
            grouped.add((int(m["layer"]), lin))
        if (m := ROUTER_WEIGHT.match(key)) and shape:
            routers[int(m["layer"])] = int(shape[0])
    num_experts = max(routers.values()) if routers else (max(experts_seen) + 1 if experts_seen else None)
    grouped |= set(per_expert)
    linears = []
    if per_expert:
        expected = set(range(num_experts)) if num_experts else set()
        for layer, lin in sorted(grouped):
            present = per_expert.get((layer, lin), set())
            linears.append(LinearAmax(layer, lin, sorted(present), sorted(expected - present)))
    if per_expert and shared:
        kind = CkptLayout.MIXED
    elif per_expert:
        kind = CkptLayout.PER_EXPERT
    elif shared:
        kind = CkptLayout.SHARED
    elif expert_input_amax:
        kind = CkptLayout.INCOMPLETE
    else:
        kind = CkptLayout.UNQUANTIZED  # dense layers may be quantized; the experts hold no weight amax
    return Layout(
        path=path,
        kind=kind,
        backend=backend,
        num_tensors=len(tensors),
        num_layers=len(layers),
        num_experts=num_experts,
        experts_seen=sorted(experts_seen),
        dtypes=dict(Counter(d for d, _ in tensors.values())),
        amax_dtypes=sorted(amax_dtypes),
        linears=linears,
        shared_keys=sorted(shared),
        expert_amax_kinds=sorted(kinds),
    )


def inspect_checkpoint(path: Path | str) -> Layout:
    """Read a checkpoint's metadata (no tensor data, no process group) and classify it."""
    from dataclasses import replace

    from harness.check.defects import COMMON_PT

    backend, tensors = read_metadata(path)
    lay = classify(tensors, path=str(path), backend=backend)
    return replace(lay, has_common_pt=(Path(path) / COMMON_PT).is_file())
