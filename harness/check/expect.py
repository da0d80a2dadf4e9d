"""What a golden checkpoint must load as under the fix, derived from the checkpoint's own tensors.

The golden cells have no save stage whose model could serve as the reference, so the reference
is built here, in the controller, from the checkpoint files and the documented back-compat rules
(harness/fix/legacy_load.py states them; this module re-derives them independently, reading the
files with torch's own DCP reader rather than the fix's code path):

- a tensor the checkpoint holds loads bit-exact;
- a per-expert ``...experts.experts.{e}.<linear>.weight_quantizer._amax`` the checkpoint lacks:
  * shared layout (ModelOpt <= 0.46): the grouped linear's shared amax, for every expert;
  * otherwise: ``max|W_e|`` of the whole expert weight in the checkpoint -- what ModelOpt's max
    calibration stores for an NVFP4 weight quantizer (every amax the committed 0.47.0 goldens
    hold equals it: tests/test_golden_expect.py);
- the shared amax itself is not a key of a 0.47.0 model, so it is not in the reference.
The result is written as a save stage's reference (harness/check/compare.py format), so the normal
load stage compares every rank's post-``load_state_dict`` state against it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

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


def expected_state(stored: dict[str, torch.Tensor], runtime_layout: str = "per-expert") -> Expectation:
    """``runtime_layout``: that of the modelopt that will load it (harness/check/versions.py). A
    shared-layout modelopt (<= 0.46) has no per-expert amax: it must load the stored tensors
    as they are, nothing derived."""
    if runtime_layout == "shared":
        return Expectation(tensors=dict(stored))
    exp = Expectation(tensors={})
    amax_dtypes = {v.dtype for k, v in stored.items() if k.endswith(WEIGHT_AMAX_SUFFIX)}
    amax_dtype = amax_dtypes.pop() if len(amax_dtypes) == 1 else torch.bfloat16
    for key, value in stored.items():
        m = EXPERT_WEIGHT.match(key)
        amax_key = weight_amax_key(key) if m else None
        if m is None or amax_key in stored:
            continue
        legacy = shared_weight_amax_key(m)
        linear = legacy[: -len("." + WEIGHT_AMAX_SUFFIX)]
        if legacy in stored:
            exp.tensors[amax_key] = stored[legacy].clone()
            exp.from_legacy.setdefault(linear, []).append(int(m["expert"]))
            if legacy not in exp.legacy_keys:
                exp.legacy_keys.append(legacy)
        else:
            exp.tensors[amax_key] = value.float().abs().amax().reshape(1).to(amax_dtype)
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
