"""What a golden checkpoint must load as under the fix, derived from the checkpoint's own tensors.

The golden cells have no save stage whose model could serve as the reference, so the reference
is built here, in the controller, from the checkpoint files and the documented back-compat rules
(moe_ckpt_fix/legacy_load.py states them; this module re-derives them independently, reading the
files with torch's own DCP reader rather than the fix's code path):

- a tensor the checkpoint holds loads bit-exact;
- a per-expert ``...experts.experts.{e}.<linear>.weight_quantizer._amax`` the checkpoint lacks:
  * shared layout (ModelOpt <= 0.46): the grouped linear's shared amax, for every expert;
  * otherwise: ``max|W_e|`` of the whole expert weight in the checkpoint -- what ModelOpt's max
    calibration stores for an NVFP4 weight quantizer (every amax the committed 0.47.0 goldens
    hold equals it: tests/test_golden_expect.py);
- the shared amax itself is not a key of a 0.47.0 model, so it is not in the reference.
The result is written as a save stage's reference (harness/rank/compare.py format), so the normal
load stage compares every rank's post-``load_state_dict`` state against it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.check.layouts import CkptLayout
from harness.check.keys import EXPERT_WEIGHT, WEIGHT_AMAX_SUFFIX, shared_weight_amax_key, weight_amax_key



@dataclass
class Expectation:
    tensors: dict[str, torch.Tensor]
    from_legacy: dict[str, list[int]] = field(default_factory=dict)  # "<prefix>.<linear>" -> experts
    max_calibrated: dict[str, list[int]] = field(default_factory=dict)
    legacy_keys: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "tensors": len(self.tensors),
            "expert_amax_from_legacy": sum(len(v) for v in self.from_legacy.values()),
            "expert_amax_max_calibrated": sum(len(v) for v in self.max_calibrated.values()),
            "max_calibrated": self.max_calibrated,
        }


def read_checkpoint_tensors(ckpt_dir: Path | str) -> dict[str, torch.Tensor]:
    """Every tensor of a torch_dist checkpoint, whole, in this process (no process group)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    md = FileSystemReader(str(ckpt_dir)).read_metadata()
    tensors = {k for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    # Every key is requested: this planner cannot skip megatron's keys (no planner_data).
    everything = _load_state_dict_from_keys(set(md.state_dict_metadata), checkpoint_id=str(ckpt_dir))
    return {k: v for k, v in everything.items() if k in tensors}


# Where a per-expert amax the checkpoint lacks comes from: ("legacy", shared key) or ("max", weight key).
FROM_LEGACY, MAX_CALIBRATED = "legacy", "max"


def derived_amax_sources(keys) -> dict[str, tuple[str, str]]:
    """Per-expert weight amax key -> (FROM_LEGACY, shared amax key) | (MAX_CALIBRATED, weight key),
    for every expert weight in ``keys`` whose own amax is absent. Key names only, so it works on
    a checkpoint's metadata (harness/golden/repair.py) as on loaded tensors (expected_state)."""
    keys = set(keys)
    out = {}
    for key in sorted(keys):
        m = EXPERT_WEIGHT.match(key)
        if m is None or weight_amax_key(key) in keys:
            continue
        legacy = shared_weight_amax_key(m)
        out[weight_amax_key(key)] = (FROM_LEGACY, legacy) if legacy in keys else (MAX_CALIBRATED, key)
    return out


def max_calibrated_amax(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What ModelOpt's max calibration stores for a per-tensor NVFP4 weight quantizer: max|W| over
    the whole expert weight (all its TP shards), shape (1,), in the amax dtype."""
    return weight.float().abs().amax().reshape(1).to(dtype)


def amax_dtype_of(dtypes) -> torch.dtype:
    """The dtype of the checkpoint's weight amax (bf16 when none or several are stored)."""
    dtypes = set(dtypes)
    return dtypes.pop() if len(dtypes) == 1 else torch.bfloat16


def expected_state(stored: dict[str, torch.Tensor], runtime_layout: str = CkptLayout.PER_EXPERT) -> Expectation:
    """``runtime_layout``: that of the modelopt that will load it (harness/check/versions.py). A
    shared-layout modelopt (<= 0.46) has no per-expert amax: it must load the stored tensors
    as they are, nothing derived."""
    if runtime_layout == CkptLayout.SHARED:
        return Expectation(tensors=dict(stored))
    exp = Expectation(tensors={})
    amax_dtype = amax_dtype_of(v.dtype for k, v in stored.items() if k.endswith(WEIGHT_AMAX_SUFFIX))
    for amax_key, (how, source) in derived_amax_sources(stored).items():
        m = EXPERT_WEIGHT.match(amax_key[: -len("_quantizer._amax")])
        linear = f"{m['prefix']}.{m['name']}"
        if how == FROM_LEGACY:
            exp.tensors[amax_key] = stored[source].clone()
            exp.from_legacy.setdefault(linear, []).append(int(m["expert"]))
            if source not in exp.legacy_keys:
                exp.legacy_keys.append(source)
        else:
            exp.tensors[amax_key] = max_calibrated_amax(stored[source], amax_dtype)
            exp.max_calibrated.setdefault(linear, []).append(int(m["expert"]))
    for key, value in stored.items():
        if key not in exp.legacy_keys:
            exp.tensors[key] = value
    for d in (exp.from_legacy, exp.max_calibrated):
        for experts in d.values():
            experts.sort()
    return exp


def write_reference(exp: Expectation, reference_dir: Path, topology_id: str) -> None:
    """The expectation as one rank's full-tensor shards (compare.load_reference reads it)."""
    reference_dir.mkdir(parents=True, exist_ok=True)
    shards = [
        {"key": k, "global_shape": tuple(v.shape), "global_offset": (0,) * v.dim(),
         "local_shape": tuple(v.shape), "replica_id": 0, "data": v}
        for k, v in sorted(exp.tensors.items())
    ]
    torch.save(shards, reference_dir / "shards_rank0.pt")
    (reference_dir / "saved_topology.txt").write_text(topology_id)
