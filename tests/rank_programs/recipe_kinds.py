"""One CPU process: the cpu tier's model with each recipe's quantizers put in place by ModelOpt
itself (``set_quantizer_by_cfg``, no calibration), and the amax kind each enabled weight
quantizer is configured for, per module family, as JSON on stdout.

tests/test_recipes.py compares it with harness/check/recipes.py: the catalogue must say what
ModelOpt's own recipe files and matching make of them.
"""
from __future__ import annotations

import json
import os
import sys


def configured_kind(q) -> str:
    """static-block: static NVFP4 blocks (an _amax per block and a _global_amax); scalar: one
    amax per quantizer (dynamic blocks keep only their global amax, per-tensor keeps one)."""
    from harness.model.recipes import SCALAR, STATIC_BLOCK

    blocks = q.block_sizes or {}
    if blocks.get("type") == "static":
        return STATIC_BLOCK
    if q.axis is None:
        return SCALAR
    return f"axis{q.axis}"


def main(recipes: list[str]) -> dict:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    from harness.model.cpu_shims import apply_cpu_shims

    apply_cpu_shims()
    from modelopt.torch.quantization.conversion import replace_quant_module, set_quantizer_by_cfg
    from modelopt.torch.quantization.nn import TensorQuantizer

    from harness.model.gpt import CPU_SIZE, build_gpt
    from harness.model.recipes import Recipe, module_family, quant_config
    from harness.paths import REPO_ROOT
    from harness.rank.setup import init_rank
    from harness.tiers import Backend, Tier
    from harness.topology.topology import Topology

    topo = Topology.parse("tp1-etp1-ep1")
    init_rank(topo, Tier.CPU, 60)
    out = {}
    for ref in recipes:
        model = build_gpt(topo, CPU_SIZE, Backend.LOCAL)
        replace_quant_module(model)
        set_quantizer_by_cfg(model, quant_config(Recipe.parse(ref), REPO_ROOT)["quant_cfg"])
        kinds: dict[str, set] = {}
        for name, q in model.named_modules():
            if isinstance(q, TensorQuantizer) and name.endswith("weight_quantizer") and q.is_enabled:
                kinds.setdefault(module_family(name), set()).add(configured_kind(q))
        out[ref] = {k: sorted(v) for k, v in kinds.items()}
    return out


if __name__ == "__main__":
    print("RECIPE_KINDS " + json.dumps(main(sys.argv[1:])))
