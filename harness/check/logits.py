"""The logits criterion: judges the figures harness/rank/logits.py measured (why these numbers:
that module's docstring). Pure: dicts in, dicts out, so recorded runs can be judged again.

Two questions, kept apart:

- What the checkpoint did (ASSERTED): does the loaded model compute what the saved state
  computes at the load topology? The loaded model's logits against the same model with the
  saved state written into it (``logits_at_load_topology``): same topology, same kernels, same
  reduction order, torch's deterministic algorithms on, so the two passes must be equal.
  Tolerance 0 on every tier: measured 0.0 on the H200 at 23 MoE layers x 128 experts under
  deterministic algorithms (docs/runs/20261203-095205-shape-nano) and 0.0 on the cpu tier;
  a tiny fp tolerance would only be added if a recorded run showed the need.
- What the topology does (REPORTED, never a checkpoint failure): the same state at the save
  topology and at the load topology (``cross_topology``, from ``logits_plain``: the loaded
  model against the checkpoint's logits at the save topology). A different TP/EP split reduces
  in another order; in bf16 that moves logits, and top-k near-ties turn it into routing flips
  that cascade through MoE layers (0.137 rel at 4 layers x 64 experts, docs/findings.md). It is judged
  only against a noise floor measured in the same cell (``noise_floor``): the bf16 rounding of
  the forward at each topology, i.e. how far each bf16 forward is from the fp32 forward of the
  same state there. By the triangle inequality the cross-topology difference can exceed that
  floor only by as much as the two fp32 forwards differ: beyond the floor (plus fp32 rounding)
  means the two topologies compute different functions, a forward finding of its own
  (``cross_topology.beyond_noise_floor``), reported, not a checkpoint failure.
"""
from __future__ import annotations

from harness.tiers import facts, on_cuda

# fp32 rounding of the whole forward across splits (the cpu tier's measured cross-topology
# figures are <= 2e-6 relative; 1e-4 was this harness's fp32 tolerance before logits were split into asserted and reported).
FP32_ROUNDING = 1e-4
# ``logits_reference`` of a scenario: kept so older scenario files read. Since the split every
# load cell asserts the load-topology figure and reports the cross-topology one, whichever is set.
LOGITS_REFERENCES = ("save-topology", "load-topology")
# Keys this module writes into a verify dict; re-judging drops the old ones first.
JUDGED_KEYS = ("logits_rel_diff", "logits_tolerance", "logits_ok", "routing_flips_allowed",
               "logits_asserted", "cross_topology")


def judge_logits(figures: dict, tier: str) -> dict:
    """The asserted load-topology figure and the reported cross-topology one, from the rank's
    measurements. A record without a load-topology figure (recorded before the split, with the
    default reference) asserts no logits: the state comparison is its checkpoint evidence."""
    out: dict = {"cross_topology": cross_topology(figures, tier)}
    at_load = figures.get("logits_at_load_topology")
    if at_load and "plain" in at_load:
        out.update({"logits_asserted": "load-topology", "logits_rel_diff": at_load["plain"]["rel_diff"],
                    "logits_tolerance": facts(tier).logits_tolerance})
        out["logits_ok"] = not logits_problems({**figures, **out})
    else:
        out["logits_asserted"] = "none: no load-topology figure in this record"
    return out


def cross_topology(figures: dict, tier: str) -> dict | None:
    """Save topology vs load topology, same state: the figure, its noise floor, the finding."""
    plain = figures.get("logits_plain")
    if not plain:
        return None
    out = {"rel_diff": plain["rel_diff"], "routing_flips": figures.get("routing_flips"),
           "routing_tokens": figures.get("routing_tokens")}
    same = figures.get("logits_plain_same_routing")
    if same:
        out["same_routing_rel_diff"] = same["rel_diff"]
    floor = noise_floor(figures, tier)
    out.update(floor)
    if floor.get("noise_floor") is not None:
        out["beyond_noise_floor"] = plain["rel_diff"] > floor["noise_floor"]
    return out


def noise_floor(figures: dict, tier: str) -> dict:
    """The cross-topology difference that rounding alone can produce in this cell.

    cpu tier: the forward is fp32 already, its floor is fp32 rounding. GPU tiers: the bf16 vs
    fp32 distance of the same state's forward at the save and at the load topology (rank
    figures ``noise_floor_figures``) plus fp32 rounding; absent (older records, or the fp32
    pass failed): no floor, the figure is reported unjudged.
    """
    if not on_cuda(tier):
        return {"noise_floor": FP32_ROUNDING, "noise_floor_source": "fp32 forward (cpu tier)"}
    nf = figures.get("noise_floor_figures") or {}
    if "bf16_vs_fp32_save" not in nf or "bf16_vs_fp32_load" not in nf:
        why = nf.get("error") or "not measured in this record"
        return {"noise_floor": None, "noise_floor_source": f"none ({why})"}
    return {"noise_floor": nf["bf16_vs_fp32_save"] + nf["bf16_vs_fp32_load"] + FP32_ROUNDING,
            "noise_floor_source": "bf16 vs fp32 forward of the same state at both topologies",
            "fp32_cross_topology_rel_diff": nf.get("fp32_cross_topology"),
            "fp32_routing_flips": nf.get("fp32_routing_flips")}


def logits_problems(figures: dict) -> list[str]:
    """Why judged figures fail the asserted logits rule (empty: they pass)."""
    if figures.get("logits_asserted") != "load-topology":
        return []
    if figures["logits_rel_diff"] > figures["logits_tolerance"]:
        return [f"logits at the load topology differ from the saved state's there: rel "
                f"{figures['logits_rel_diff']:.3g} > {figures['logits_tolerance']}"]
    return []


def topology_finding(verify: dict) -> str | None:
    """One line when the cross-topology difference is beyond its noise floor (a forward
    finding, not a checkpoint failure), else None."""
    ct = verify.get("cross_topology") or {}
    if not ct.get("beyond_noise_floor"):
        return None
    return (f"forward differs across topologies beyond rounding: rel {ct['rel_diff']:.3g} > "
            f"noise floor {ct['noise_floor']:.3g} ({ct['noise_floor_source']}); fp32 cross-"
            f"topology rel {ct.get('fp32_cross_topology_rel_diff')}")
