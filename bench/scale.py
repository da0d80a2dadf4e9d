"""Cost and verdict of the scale SIMULATION (harness/topology/scale.py) at production world sizes.

Why: says whether megatron-core's real validation, fed synthesized per-expert amax metadata of
64..1024 ranks, refuses the Nano and Ultra shapes under each replica rule, and what building and
validating that metadata costs in one process. Each case runs in its own forked child (imports done
once, before the fork) so its peak RSS is its own. A simulation, not a run: no model, no GPU, only the expert-amax entries.

    python bench/scale.py [--worlds 64 128 256 512 1024] [--shapes nano-save nano-load ultra]
"""
from __future__ import annotations

import argparse
import platform
import resource
import multiprocessing
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name: (tp, etp, ep, pp, experts, MoE layers). Sizes are ASSUMPTIONS: docs/scale-simulation.md.
SHAPES = {
    "nano-save": (1, 1, 8, 1, 128, 23),  # Nemotron-3 Nano 30B-A3B quantize save, dp fills the world
    "nano-load": (4, 1, 8, 1, 128, 23),  # its reload, the failing one
    "ultra": (4, 1, 8, 8, 512, 48),  # Nemotron-3 Ultra 550B-A55B PTQ save/load (pp 8 assumed)
}
WORLDS = (64, 128, 256, 512, 1024)
RULES = ("buggy", "fixed")


def one_case(world: int, shape: str, rule: str) -> dict:
    warnings.filterwarnings("ignore")
    from harness.topology import scale
    from harness.topology.topology import Topology

    tp, etp, ep, pp, experts, layers = SHAPES[shape]
    topo = Topology(tp, etp, ep, pp, world).check()
    scale.validate(scale.synthesize(Topology(1, 1, 1), 1, 1, rule))  # imports out of the figures
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    per_rank = scale.synthesize(topo, experts, layers, rule)
    t1 = time.perf_counter()
    failing = scale.validate(per_rank)
    t2 = time.perf_counter()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    keys = layers * 2 * experts
    return {
        "world": world, "shape": shape, "topology": topo.id, "rule": rule, "experts": experts,
        "moe_layers": layers, "entries": sum(map(len, per_rank)), "keys": keys,
        "build_s": round(t1 - t0, 2), "validate_s": round(t2 - t1, 2),
        "peak_rss_mib": round(peak_kb / 1024), "delta_rss_mib": round((peak_kb - base_kb) / 1024),
        "failing_keys": len(failing),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from harness.topology import scale
    from harness.topology.topology import Topology

    scale.validate(scale.synthesize(Topology(1, 1, 1), 1, 1, "buggy"))  # import once, then fork
    ctx = multiprocessing.get_context("fork")
    print(f"# SIMULATION (not a run): {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.node() or 'host'}, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}")
    head = ("world", "shape", "topology", "rule", "entries", "keys", "build_s", "validate_s",
            "peak_rss_mib", "delta_rss_mib", "failing_keys")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    bad = 0
    for world in args.worlds:
        for shape in args.shapes:
            for rule in args.rules:
                try:
                    with ctx.Pool(1) as pool:
                        row = pool.apply(one_case, (world, shape, rule))
                except Exception as exc:  # noqa: BLE001 - one bad case must not hide the others
                    bad += 1
                    print(f"| {world} | {shape} | - | {rule} | FAILED: {type(exc).__name__}: {exc} |")
                    continue
                print("| " + " | ".join(str(row[h]) for h in head) + " |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
