"""The logits criterion: judges the figures harness/rank/logits.py measured (why these numbers:
that module's docstring). Pure: dicts in, dicts out, so recorded runs can be judged again."""
from __future__ import annotations

# Relative max-abs tolerance of the asserted ``plain`` logits: fp32 on the cpu tier, bf16 on GPUs.
TOLERANCE = {"cpu": 1e-4, "gpu-shared": 5e-2, "gpu": 5e-2}
MAX_FLIP_FRACTION = 0.125  # of the batch's tokens (4 of 32): a flip needs a near-tie in router scores
# What the asserted logits of a load are compared with (a scenario's ``logits_reference``):
# - "save-topology": the checkpoint's logits at the save topology, so the reshard itself is
#   checked end to end (bf16 reduction-order noise of the other split, routing flips allowed);
# - "load-topology": the loaded model against the same model with the saved state written into
#   it, both at the load topology (same kernels, same reduction order). For deep MoE models,
#   where near-ties in top-k routing cascade through the layers and attention spreads a flipped
#   token to the others: at 23 MoE layers x 128 experts (H200, docs/runs/20261203-034324-shape-nano)
#   15-17 of 32 tokens flipped and even identically routed tokens moved 0.053-0.061 rel with every
#   tensor and amax bit-exact. The cross-topology figures are still reported.
LOGITS_REFERENCES = ("save-topology", "load-topology")


def judge_logits(figures: dict, tier: str) -> dict:
    """The asserted figures from ``harness.rank.logits.logits_figures``'s measurements (see module docstring).

    Without routing records (older references) or with every token flipped, the whole batch's
    plain logits are what is asserted.
    """
    at_load = figures.get("logits_at_load_topology")
    if at_load:  # logits_reference = "load-topology": routing flips across splits not asserted
        out = {"logits_rel_diff": at_load["plain"]["rel_diff"], "logits_tolerance": TOLERANCE[tier],
               "logits_asserted": "load-topology"}
        out["logits_ok"] = not logits_problems({**figures, **out})
        return out
    asserted = figures.get("logits_plain_same_routing", figures["logits_plain"])
    out = {
        "logits_rel_diff": asserted["rel_diff"],
        "logits_tolerance": TOLERANCE[tier],
        "routing_flips_allowed": int(MAX_FLIP_FRACTION * figures.get("routing_tokens", 0)),
    }
    out["logits_ok"] = not logits_problems({**figures, **out})
    return out


def logits_problems(figures: dict) -> list[str]:
    """Why judged figures fail the logits rule (empty: they pass). Records judged before routing
    was recorded carry no ``routing_flips_allowed``: only their tolerance applies."""
    problems = []
    flips, allowed = figures.get("routing_flips", 0), figures.get("routing_flips_allowed")
    if allowed is not None and flips > allowed and figures.get("logits_asserted") != "load-topology":
        problems.append(f"{flips} of {figures['routing_tokens']} tokens routed to other "
                        f"experts (at most {allowed} allowed)")
    if figures["logits_rel_diff"] > figures["logits_tolerance"]:
        problems.append(
            f"logits differ: rel {figures['logits_rel_diff']:.3g} > {figures['logits_tolerance']}")
    return problems
