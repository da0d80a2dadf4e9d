"""Human-readable collision map: counts per world size and the failing shapes."""
from __future__ import annotations

from collections import defaultdict


def summary(entries) -> dict:
    return {
        "topologies": len(entries),
        "buggy_fail": sum(not e.buggy_ok for e in entries),
        "fixed_fail": sum(not e.fixed_ok for e in entries),
    }


def render_map(entries) -> str:
    by_world = defaultdict(list)
    for e in entries:
        by_world[e.world].append(e)
    s = summary(entries)
    lines = [
        "Collision map (oracle; cross-checked against megatron-core's real validation in tests)",
        f"{s['topologies']} valid (tp, etp, ep, pp) topologies up to {max(by_world)} ranks: "
        f"{s['buggy_fail']} fail under modelopt 0.47.0's replica_id rule, "
        f"{s['fixed_fail']} under the fix.",
        "",
        f"{'world':>5}  {'topologies':>10}  {'fail 0.47.0':>11}  {'fail fixed':>10}  failing shapes (main replicas per expert)",
    ]
    for w in sorted(by_world):
        es = by_world[w]
        bad = [e for e in es if not e.buggy_ok]
        shapes = ", ".join(
            f"{e.id}({e.buggy_collisions[0].main_replicas})" for e in bad[:4]
        ) + (f", +{len(bad) - 4} more" if len(bad) > 4 else "")
        lines.append(f"{w:>5}  {len(es):>10}  {len(bad):>11}  {sum(not e.fixed_ok for e in es):>10}  {shapes}")
    return "\n".join(lines)
