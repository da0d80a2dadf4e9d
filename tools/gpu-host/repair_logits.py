"""One rank (torchrun, world 1, tier gpu-shared, TE): a repaired golden loaded by the installed
ModelOpt vs a model calibrated fresh from the same weights (part 3b).

    torchrun --nproc-per-node 1 tools/gpu-host/repair_logits.py GOLDEN_DIR OUT_JSON

1. the harness GPT (the golden manifest's size) at tp1-etp1-ep1 restores the golden's ModelOpt
   state and loads ``GOLDEN_DIR/ckpt`` the normal resume way (harness/model/checkpoint.py);
   every expert weight-quantizer amax on the model is counted and compared with the checkpoint's;
2. a second model of the same size gets the loaded model's weights (no quantizer state) and is
   quantized and max-calibrated fresh (harness/model/quant.py, the path the goldens were made by);
3. both models' logits on the harness's seeded batch (harness/rank/logits.py): ``plain`` (no
   fake quantization, weights only) and ``nvfp4``; amax loaded vs fresh, per quantizer.
Expected: novalidate-repaired equals the fresh calibration in every weight amax (max|W| per
expert) and in ``nvfp4`` logits up to the input-amax difference; the 0.46.1-repaired differs in
experts 1-7's weight amax (the shared value, expert 0's, is what 0.46.x itself loads for every
expert), and the figures say by how much.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

_EXPERT_WEIGHT_AMAX = re.compile(r"\.experts\..*weight_quantizer\.\d+\._amax$")


def amax_buffers(model) -> dict:
    """Every quantizer ``_amax`` (and ``_global_amax``) on the model, by module state-dict key."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
            if "_quantizer" in k and k.endswith("amax")}


def main(golden: Path, out: Path) -> int:
    import torch

    from harness.golden.manifest import verify_manifest
    from harness.model.checkpoint import load_checkpoint, restore_modelopt_state, sharded_metadata
    from harness.model.gpt import build_gpt
    from harness.model.quant import quantize
    from harness.rank.logits import _figures, measure_logits
    from harness.rank.setup import Clock, device, prepare_rank
    from harness.rank.spec import StageSpec
    from harness.records import Stage
    from harness.tiers import Backend, Tier

    doc = verify_manifest(golden)
    ckpt = golden / "ckpt"
    spec = StageSpec(stage=Stage.LOAD, topology="tp1-etp1-ep1-pp1", tier=Tier.GPU_SHARED,
                     backend=Backend.TE, ckpt_dir=str(ckpt), reference_dir=tempfile.mkdtemp(),
                     size=doc["size"])
    _, loaded = prepare_rank(spec, Clock())
    restore_modelopt_state(loaded, ckpt)
    load_checkpoint(loaded, ckpt, sharded_metadata(spec.singleton_local_shards), strict=True)
    amax_loaded = amax_buffers(loaded)
    experts_loaded = sorted(k for k in amax_loaded if _EXPERT_WEIGHT_AMAX.search(k))
    logits_loaded = measure_logits(loaded, spec.model_size, spec.tier, device())

    fresh = build_gpt(spec.topo, spec.model_size, spec.backend, spec.seed + 1)  # other init
    weights = {k: v for k, v in loaded.state_dict().items()
               if "_quantizer" not in k and not k.endswith("_extra_state") and torch.is_tensor(v)}
    result = fresh.load_state_dict(weights, strict=False)
    quantize(fresh, spec.model_size, device())
    amax_fresh = amax_buffers(fresh)
    logits_fresh = measure_logits(fresh, spec.model_size, spec.tier, device())

    import modelopt

    differing = {k: [amax_loaded[k].float().flatten().tolist(), amax_fresh[k].float().flatten().tolist()]
                 for k in sorted(set(amax_loaded) & set(amax_fresh))
                 if not torch.equal(amax_loaded[k], amax_fresh[k])}
    report = {
        "golden": golden.name, "nvidia-modelopt": modelopt.__version__, "topology": spec.topology,
        "expert_weight_amax_on_model": len(experts_loaded),
        "expert_weight_amax_expected": doc["size"]["num_experts"] * doc["size"]["num_layers"] * 2,
        "weights_copied": len(weights), "missing_in_fresh_copy": list(result.missing_keys)[:10],
        "amax_keys_loaded": len(amax_loaded), "amax_keys_fresh": len(amax_fresh),
        "amax_differing": len(differing),
        "expert_weight_amax_differing": sorted(k for k in differing if _EXPERT_WEIGHT_AMAX.search(k)),
        "amax_differences": dict(list(differing.items())[:40]),
        "logits_plain_loaded_vs_fresh": _figures(logits_loaded["plain"], logits_fresh["plain"]),
        "logits_nvfp4_loaded_vs_fresh": (_figures(logits_loaded["nvfp4"], logits_fresh["nvfp4"])
                                         if "nvfp4" in logits_loaded and "nvfp4" in logits_fresh else None),
    }
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "amax_differences"}, indent=1))
    torch.distributed.destroy_process_group()
    return 0 if report["expert_weight_amax_on_model"] == report["expert_weight_amax_expected"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
