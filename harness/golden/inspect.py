"""``python -m harness inspect <ckpt>``: a checkpoint's layout (harness/golden/layout.py) and what
each known (ModelOpt, megatron-core) pair does with it (harness/golden/forecast.py).
"""
from __future__ import annotations

import sys

from harness.check.layouts import CkptLayout, GoldenLayout
from harness.check.recipes import SCALAR, STATIC_BLOCK
from harness.golden.layout import Layout, inspect_checkpoint
from harness.golden.storage import DamagedCheckpoint, NotACheckpoint


_MEANING = {
    CkptLayout.PER_EXPERT: "ModelOpt >= 0.47.0 layout: one weight-quantizer amax per expert",
    CkptLayout.SHARED: "ModelOpt <= 0.46.x layout: one shared weight-quantizer amax per grouped linear",
    CkptLayout.MIXED: "BOTH per-expert and shared weight-quantizer amax keys: do not load without checking",
    CkptLayout.INCOMPLETE: "experts quantized but NO expert weight-quantizer amax saved",
    CkptLayout.UNQUANTIZED: "no expert weight-quantizer state",
}


_KINDS = {
    SCALAR: "one amax per expert weight quantizer: dynamic NVFP4 or FP8 per-tensor",
    STATIC_BLOCK: "a per-block _amax and a _global_amax per expert: static NVFP4, e.g. the Ultra "
                  "recipe nvfp4-4o6; a load at another expert TP has no rule yet "
                  "(harness/check/versions.py)",
}


def render(lay: Layout) -> str:
    lines = [
        f"checkpoint: {lay.path} ({lay.backend}, {lay.num_tensors} tensors)",
        f"layout:     {lay.kind}  ({_MEANING[lay.kind]})",
        f"layers:     {lay.num_layers}   experts: {lay.num_experts} "
        f"(seen in keys: {len(lay.experts_seen)})",
        "dtypes:     " + ", ".join(f"{d.removeprefix('torch.')} x{n}" for d, n in sorted(lay.dtypes.items())),
    ]
    if lay.expert_amax_kinds:
        lines.append("amax kind:  " + ", ".join(f"{k} ({_KINDS[k]})" for k in lay.expert_amax_kinds))
    if lay.amax_dtypes:
        lines.append("amax dtype: " + ", ".join(d.removeprefix("torch.") for d in lay.amax_dtypes))
    if lay.kind == CkptLayout.SHARED:
        lines.append(f"shared weight_quantizer keys: {len(lay.shared_keys)} (e.g. {lay.shared_keys[0]})")
    for li in lay.linears:
        state = GoldenLayout.COMPLETE if not li.missing else f"MISSING experts {li.missing}"
        lines.append(f"  layer {li.layer} {li.linear}: {len(li.present)}/{len(li.present) + len(li.missing)} "
                     f"experts with amax, {state}")
    if lay.missing:
        n = sum(len(v) for v in lay.missing.values())
        lines.append(f"WARNING: {n} expert weight-quantizer amax missing (a checkpoint saved at "
                     "TP != ETP with sharding validation off?): unpatched modelopt 0.47.0 cannot restore "
                     "them; with harness.fix they are re-derived from the weights by max calibration "
                     "(a warning names them)")
    return "\n".join(lines)


def main(args) -> int:
    """Exit 0: report printed; 1: mixed/incomplete layout or missing expert amax; 2: not a
    checkpoint; 3: a storage file is missing or damaged (one line names it)."""
    try:
        lay = inspect_checkpoint(args.ckpt)
    except NotACheckpoint as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, DamagedCheckpoint) else 2
    from harness.golden import forecast

    fcs = forecast.forecast(lay)
    if getattr(args, "json", False):
        import json

        print(json.dumps({**lay.as_json(), "forecast": [f.as_json() for f in fcs]}, indent=1))
    else:
        print(render(lay))
        print(forecast.render(fcs))
    return 1 if lay.kind in (CkptLayout.MIXED, CkptLayout.INCOMPLETE) or lay.missing else 0
