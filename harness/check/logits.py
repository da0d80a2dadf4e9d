"""The logits criterion: judges the figures harness/rank/logits.py measured (why these numbers:
that module's docstring). Pure: dicts in, dicts out, so recorded runs can be judged again."""
from __future__ import annotations

# Relative max-abs tolerance of the asserted ``plain`` logits: fp32 on the cpu tier, bf16 on GPUs.
TOLERANCE = {"cpu": 1e-4, "gpu-shared": 5e-2, "gpu": 5e-2}
MAX_FLIP_FRACTION = 0.125  # of the batch's tokens (4 of 32): a flip needs a near-tie in router scores


def judge_logits(figures: dict, tier: str) -> dict:
    """The asserted figures from ``harness.rank.logits.logits_figures``'s measurements (see module docstring).

    Without routing records (older references) or with every token flipped, the whole batch's
    plain logits are what is asserted.
    """
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
    if allowed is not None and flips > allowed:
        problems.append(f"{flips} of {figures['routing_tokens']} tokens routed to other "
                        f"experts (at most {allowed} allowed)")
    if figures["logits_rel_diff"] > figures["logits_tolerance"]:
        problems.append(
            f"logits differ: rel {figures['logits_rel_diff']:.3g} > {figures['logits_tolerance']}")
    return problems
