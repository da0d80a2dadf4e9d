"""Nightly wall time on one GPU node: packed (bench/packing.py) vs one cell at a time.

Why: packing is worth its complexity only if it shortens the nightly run; this turns measured
cell durations from real results.json files into that number instead of a guess.

    python bench/grid.py results/*/results.json [--gpus 8] [--as-tier gpu]

Each cell needs the GPUs of its tier (harness.tiers.gpus_needed) for the larger of its save
and load world sizes; its duration is its save plus load stage (harness.report.summary.cell_seconds).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.packing import estimate_wall  # noqa: E402
from harness.report.summary import cell_seconds  # noqa: E402
from harness.tiers import Tier, gpus_needed  # noqa: E402
from harness.topology.topology import Topology, TopologyError  # noqa: E402


def world_size(topology: str | None) -> int:
    if not topology:
        return 0
    try:
        return Topology.parse(topology).world_size
    except TopologyError:
        return 1


def jobs(paths: list[str], as_tier: str | None = None) -> list[tuple[int, float]]:
    """(GPUs needed, seconds) for every measured cell in the given results.json files."""
    out = []
    for path in paths:
        for cell in json.loads(Path(path).read_text()).get("cells") or []:
            ranks = max(world_size(cell.get("save_topology")), world_size(cell.get("load_topology")), 1)
            tier = as_tier or cell.get("tier", Tier.GPU)
            out.append((gpus_needed(tier, ranks), cell_seconds(cell)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results.json files with measured durations")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs on the node (default 8)")
    ap.add_argument("--as-tier", choices=(Tier.GPU, Tier.GPU_SHARED),
                    help="count every cell as this tier (e.g. gpu-shared timings replayed as gpu)")
    args = ap.parse_args(argv)
    work = jobs(args.results, args.as_tier)
    serial = sum(s for _, s in work)
    packed = estimate_wall(work, args.gpus)
    ratio = serial / packed if packed > 0 else float("nan")
    widths: dict[int, int] = {}
    for need, _ in work:
        widths[need] = widths.get(need, 0) + 1
    mix = ", ".join(f"{n}x{w} GPU" for w, n in sorted(widths.items(), reverse=True))
    print(f"cells: {len(work)} ({mix or 'none'}) from {len(args.results)} results.json")
    print(f"one cell at a time: {serial:9.1f} s")
    print(f"packed on {args.gpus} GPUs:  {packed:9.1f} s")
    print(f"speed-up:           {ratio:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
