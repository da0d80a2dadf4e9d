"""A load's verify figures read: the logits criterion applied, the problems they show, what the
loaded model holds of the saved per-expert amax. Pure; the judge (judge.py) and the reports use
them."""
from __future__ import annotations

from harness.check.logits import JUDGED_KEYS, judge_logits, logits_problems
from harness.records import NAMED_AMAX_STATES


def judged_verify(verify: dict, tier: str) -> dict:
    """The rank's measurements with the logits criterion applied (when logits were measured);
    figures an earlier criterion judged into a recorded verify dict are dropped first."""
    measured = {k: v for k, v in verify.items() if k not in JUDGED_KEYS}
    if "logits_plain" not in measured and "logits_at_load_topology" not in measured:
        return measured
    return {**measured, **judge_logits(measured, tier)}


def verify_problems(verify: dict, known_gaps) -> list[str]:
    problems = []
    if verify.get("mismatch_count"):
        first = verify["mismatches"][0]
        problems.append(f"{verify['mismatch_count']} tensor(s) differ, first {first['key']}")
    st = verify.get("expert_amax_state") or {}
    problems += [f"{st[s]} expert amax {s} after load, first {st['examples'][s][0]}"
                 for s in NAMED_AMAX_STATES if st.get(s) and st.get("examples", {}).get(s)]
    missing = [k for k in verify.get("missing_keys", [])
               if not any(g.matches(k) for g in known_gaps)]
    if missing:
        problems.append(f"{len(missing)} saved key(s) absent after load, first {missing[0]}")
    if verify.get("unexpected_keys"):
        problems.append(f"keys not in the saved model: {verify['unexpected_keys'][0]}")
    if verify.get("logits_ok") is False:
        problems += logits_problems(verify)
    return problems


def held_after_load(verify: dict) -> str:
    """One line: what the loaded model holds for the saved per-expert amax, and its effect."""
    from harness.records import AMAX_STATES

    st = verify.get("expert_amax_state") or {}
    if not st.get("saved"):
        return "no per-expert amax in the checkpoint"
    parts = [f"{st[k]} {k}" for k in reversed(AMAX_STATES) if st.get(k)]
    text = f"expert amax after load: {', '.join(parts)} (of {st['saved']} saved)"
    eff = verify.get("logits_effect")
    if eff:
        text += (f"; NVFP4 logits vs the checkpoint's amax: {eff['nonfinite_loaded']} of "
                 f"{eff['logits']} non-finite, rel max-abs {eff['nvfp4_rel_max_abs']}")
    return text
