"""``python -m harness recipes``: every recipe the installed ModelOpt ships that quantizes routed
expert weights, as a table: its forecast amax kinds per module family (from its configuration,
through ModelOpt's own matching), what a calibration on the cpu tier's model made or ModelOpt's
refusal there, and whether each (kind, family) has a rule under the installed pair.

Why: the enumeration is ModelOpt's, never a hand-kept list (harness/rank/recipe_survey.py walks
the installed wheel in a process of its own, started by its own ``in_own_process``); this module only
reads its JSON document and says
what was derived where: the cpu tier has no Transformer Engine, so its experts are SequentialMLP
and what ModelOpt does to TE grouped experts needs a GPU save to confirm.
"""
from __future__ import annotations

import json

from harness.model.recipes import EXPERTS, OTHER, SHARED_EXPERTS

FAMILIES = (EXPERTS, SHARED_EXPERTS, OTHER)
def kinds_text(kinds: dict | None, family: str) -> str:
    return "+".join((kinds or {}).get(family, [])) or "-"


def on_cpu(row: dict) -> str:
    """What the cpu tier's calibration says: the kinds it made, or ModelOpt's refusal."""
    if "error" in row:
        return f"error outside ModelOpt: {row['error']}"
    if "refused" in row:
        if row.get("needs_gpu"):
            return f"needs a GPU (ModelOpt on CPU tensors: {row['refused']})"
        return f"not-quantizable: {row['refused']}"
    calibrated = row.get("calibrated") or {}
    if calibrated == row.get("forecast"):
        return "calibrated: as forecast"
    return "calibrated: " + "; ".join(f"{f} {'+'.join(k)}" for f, k in calibrated.items())


def rule_gaps(row: dict, behaviour) -> list[str]:
    """The (kind, family) of the forecast the pair has no rule for."""
    return [f"{kind} {family}" for family, kinds in sorted((row.get("forecast") or {}).items())
            for kind in kinds if behaviour.kind_rule(kind, family) is None]


def reshard_gaps(row: dict, behaviour) -> list[str]:
    """The (kind, family) of the forecast whose rule leaves a load at another split (ETP for the
    routed experts, TP otherwise) undecided (KindRule.reshard None: such a cell is rule-unknown)."""
    return [f"{kind} {family}" for family, kinds in sorted((row.get("forecast") or {}).items())
            for kind in kinds if (r := behaviour.kind_rule(kind, family)) is not None and r.reshard is None]


def rules_text(row: dict, behaviour) -> str:
    """The rules column: the kinds with no rule, else every kind, and which rules do not decide a
    reshard."""
    gaps = rule_gaps(row, behaviour)
    if gaps:
        return "no rule: " + ", ".join(gaps)
    undecided = reshard_gaps(row, behaviour)
    return "every kind" + (f"; reshard unknown: {', '.join(undecided)}" if undecided else "")


def table(doc: dict, behaviour) -> str:
    """The Markdown table, then the kind sets it found and the recipes left out."""
    rows = [r for r in doc["rows"] if "forecast" in r]
    out = [f"Recipes of nvidia-modelopt {doc['modelopt']} that quantize routed-expert weights: "
           f"{len(rows)} (model: {doc['model']}).",
           "Forecast: the kinds ModelOpt's own matching (on megatron-core's module names) "
           "configures per family, derived from the config; cpu tier: a real calibration of the "
           "local (SequentialMLP) experts, or ModelOpt's refusal there; TE grouped experts "
           "(TEGroupedMLP): every row needs a GPU save to confirm.", "",
           "| recipe | algorithm | routed experts | shared experts | other linears | cpu tier | "
           f"rules under {behaviour.label} |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append("| " + " | ".join(_md(x) for x in (
            r["recipe"], r.get("algorithm", ""), *(kinds_text(r["forecast"], f) for f in FAMILIES),
            on_cpu(r), rules_text(r, behaviour))) + " |")
    sets: dict[str, list[str]] = {}
    for r in rows:
        sets.setdefault(json.dumps(r["forecast"], sort_keys=True), []).append(r["recipe"])
    out += ["", f"Distinct kind sets: {len(sets)}", ""]
    out += [f"- {k}: {len(v)} recipe(s), e.g. {v[0]}" for k, v in sorted(sets.items(), key=lambda kv: -len(kv[1]))]
    left = [r for r in doc["rows"] if "left_out" in r]
    reasons: dict[str, list[str]] = {}
    for r in left:
        reasons.setdefault(r["left_out"].split(":")[0], []).append(r["recipe"])
    out += ["", f"Left out: {len(left)}", ""]
    out += [f"- {why}: {len(refs)} ({', '.join(refs)})" for why, refs in sorted(reasons.items())]
    return "\n".join(out) + "\n"


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
