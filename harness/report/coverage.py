"""What the committed GPU evidence covers: which of the jobs' recipes and modules have run.

Why: a verdict is only true for what ran. The "Not covered yet" list of docs/evidence.md says which
recipe or module has no committed GPU run, and tests/test_coverage.py keeps that list equal to
what this module reads from tests/data/runs/: a recipe or module that gains evidence must leave
the list, and a new one without evidence must join it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.model.recipes import Recipe
from harness.paths import COMMITTED_RUNS
from harness.records import Outcome
from harness.tiers import Tier, on_cuda

# Outcomes of a cell whose stages ran (skipped, blocked and interrupted ones did not run it).
RAN = (Outcome.PASS, Outcome.BUG_REPRODUCED, Outcome.UNEXPECTED_FAILURE, Outcome.UNEXPECTED_PASS,
       Outcome.RULE_UNKNOWN, Outcome.KNOWN_REFUSAL, Outcome.NOT_QUANTIZABLE)

RUNS_DIR = COMMITTED_RUNS


@dataclass(frozen=True)
class Item:
    name: str  # as the README lists it
    covered_by: tuple[str, ...]  # committed results files with a GPU cell that ran it


# The jobs' modules (harness/model/modules.py), each with what shows it on in a scenario's size.
MODULES = {
    "shared experts": lambda s: bool(s.moe_shared_expert_intermediate_size),
    "sigmoid router with expert bias": lambda s: s.moe_router_enable_expert_bias,
    "MTP layers": lambda s: bool(s.mtp_num_layers),
    "latent MoE projections": lambda s: bool(s.moe_latent_size),
    "hybrid Mamba + MoE model": lambda s: s.kind == "hybrid",
}


def _ran_cells(runs_dir: Path):
    from harness.check.results_file import read_results
    from harness.records import RunResults

    for path in sorted(runs_dir.glob("*.results.json")):
        for rec in RunResults.of(read_results(path)).cells:
            if rec.outcome in RAN and on_cuda(rec.tier or Tier.GPU_SHARED):
                yield path.name, rec


def scenario_recipes(scenarios) -> list[str]:
    """The recipes the committed GPU scenarios name, sorted: what the evidence must cover."""
    return sorted({s.recipe for s in scenarios if on_cuda(s.tier)})


def coverage(runs_dir: Path = RUNS_DIR) -> list[Item]:
    """Every recipe a committed GPU scenario names and every module, with the committed runs that
    ran it on a GPU tier."""
    from harness.scenario.scenarios import load_all

    scenarios = load_all()
    sizes = {s.name: s.size for s in scenarios}
    recipes: dict[str, set[str]] = {ref: set() for ref in scenario_recipes(scenarios)}
    modules: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, rec in _ran_cells(runs_dir):
        recipes.setdefault(rec.recipe_ref, set()).add(name)
        size = sizes.get(rec.scenario)
        for module, on in MODULES.items():
            if size is not None and on(size):
                modules[module].add(name)
    return ([Item(f"recipe {Recipe.parse(ref).label}", tuple(sorted(v))) for ref, v in recipes.items()]
            + [Item(name, tuple(sorted(v))) for name, v in modules.items()])


def not_covered(runs_dir: Path = RUNS_DIR) -> list[str]:
    """The "Not covered yet" list of docs/evidence.md, in its order."""
    return [i.name for i in coverage(runs_dir) if not i.covered_by]
