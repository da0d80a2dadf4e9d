"""Randomized cells off the committed grid: ``python -m harness sample --seed S --cells N``.

Each draw is a save topology, a load topology and a model size (layers, experts, top-k) that
the committed scenarios do not have, valid for that size (harness/topology/topology.py),
within a rank budget. With ``--library RELEASE`` each save also draws its quantization recipe
from that ModelOpt release's whole library (the recipes whose own matching quantizes routed
experts: harness/check/matching.py ``library``) and its optional modules (MODULE_DRAWS): the
jobs' recipes are not the default one, and a judge that knows only the committed recipes would
pass the grid and fail off it. Every draw becomes an ordinary Scenario (a save-only cell and the save ->
load cell) with ``expect = "oracle"``: its expectation comes from the rules of the modelopt
that runs it, so every sampled cell checks rule agreement. The same seed gives the same cells.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from harness.check import matching
from harness.model.gpt import MODULE_FIELDS, ModelSize, default_size
from harness.model.modules import NO_POSITION_EMBEDDING
from harness.model.recipes import DEFAULT_RECIPE
from harness.records import ExpectMode, Patch
from harness.scenario.cells import Scenario
from harness.scenario.scenarios import load_all
from harness.tiers import Backend, Tier, facts
from harness.topology.topology import Topology, enumerate_topologies

LAYERS = (1, 2, 3, 4)
EXPERTS = (8, 16, 32, 64, 128)
# Top-1 is left out: megatron-core 0.19.2 refuses softmax top-1 routing without
# moe_router_pre_softmax (megatron/core/transformer/transformer_config.py:2329-2336), which the
# model under test does not set.
TOPK = (2, 4, 6, 8)
MAX_ETP, MAX_PP = 4, 2
DEFAULT_RANKS = 8  # gloo ranks sharing one H200 (tier gpu-shared)
# The optional modules a library draw switches on, each on a coin of its own (harness/model/
# modules.py): a shared expert, the sigmoid router with expert bias, one MTP layer, no position
# embedding (Nemotron-3's); each is a ModelSize field set, off at its default.
MODULE_DRAWS = (
    {"moe_shared_expert_intermediate_size": 64},
    {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
    {"mtp_num_layers": 1},
    {"position_embedding_type": NO_POSITION_EMBEDDING},
)


@dataclass(frozen=True)
class Draw:
    save: Topology
    load: Topology
    size: ModelSize
    recipe: str = DEFAULT_RECIPE

    @property
    def key(self) -> tuple:
        return (self.save.id, self.load.id, self.size, self.recipe)


def committed_cells() -> set[tuple]:
    """(save id, load id, size, recipe) of every committed scenario's load cell."""
    return {(c.save.id, c.load.id, c.scenario.size, c.scenario.recipe) for s in load_all()
            for c in s.cells() if c.load is not None and not c.golden}


def draw_cells(seed: int, count: int, max_ranks: int = DEFAULT_RANKS, tier: str = Tier.GPU_SHARED,
               exclude: set[tuple] | None = None, loads_per_save: int = 1,
               recipes: list[str] | None = None) -> list[Draw]:
    """``count`` distinct draws, none in ``exclude`` (default: the committed grid's cells).
    ``recipes``: each (save, model) also draws one of them and its optional modules; None keeps
    the default recipe and no modules (the draws of a seed are then those before recipes were).

    Each drawn (save topology, model size) gets up to ``loads_per_save`` distinct loads: cells
    sharing a save share its stage, as in the committed grids (fewer stages per cell on the GPU).
    A save at pp > 1 calibrates through megatron-core's pipeline schedule (CUDA only), so on the
    cpu tier every topology is pp 1 (a load at pp > 1 measures no logits there either)."""
    if count < 0 or loads_per_save < 1 or max_ranks < 1:
        raise ValueError("cells must be >= 0, loads per save and ranks >= 1")
    rng = random.Random(seed)
    exclude = committed_cells() if exclude is None else exclude
    base = default_size(facts(tier).backend)
    max_pp = MAX_PP if facts(tier).cuda else 1
    out, seen, tries = [], set(exclude), 0
    while len(out) < count:
        tries += 1
        if tries > 1000 * max(count, 1):
            raise ValueError(f"cannot draw {count} distinct cells within {max_ranks} ranks "
                             f"(got {len(out)})")
        experts = rng.choice(EXPERTS)
        size = replace(base, num_layers=rng.choice(LAYERS), num_experts=experts,
                       moe_router_topk=rng.choice([k for k in TOPK if k <= experts]))
        recipe = DEFAULT_RECIPE
        if recipes:
            recipe = rng.choice(recipes)
            for fields in MODULE_DRAWS:
                if rng.random() < 0.5:
                    size = replace(size, **fields)
        topos = _topologies(max_ranks, max_pp, size, facts(tier).backend == Backend.LOCAL)
        if not topos:
            continue
        save = rng.choice(topos)
        for load in rng.sample(topos, min(len(topos), loads_per_save + 1)):
            d = Draw(save, load, size, recipe)
            if load == save or d.key in seen or len(out) >= count or _drawn_loads(out, d) >= loads_per_save:
                continue
            seen.add(d.key)
            out.append(d)
    return out


def _drawn_loads(drawn: list[Draw], d: Draw) -> int:
    return sum(1 for x in drawn if (x.save, x.size, x.recipe) == (d.save, d.size, d.recipe))


def _topologies(max_ranks: int, max_pp: int, size: ModelSize, local_backend: bool) -> list[Topology]:
    """Every implicit-world topology (no explicit -w) within the budget, ETP <= 4, PP <= max_pp.
    Sorted, so that a seed draws the same cells whatever the enumeration order. The local
    backend (cpu tier) keeps TP = ETP = 1 as the committed cpu grid does (scenarios/cpu_reshard.toml):
    ModelOpt 0.47.0's QuantSequentialMLP refuses TP > 1 with EP > 1
    (modelopt/torch/quantization/plugins/megatron.py:736-741), and the version rules
    (harness/check/versions.py) describe TEGroupedMLP, not SequentialMLP."""
    found = {Topology(t.tp, t.etp, t.ep, t.pp) for t in enumerate_topologies(max_ranks, size)
             if t.etp <= MAX_ETP and t.pp <= max_pp
             and t.world_size == Topology(t.tp, t.etp, t.ep, t.pp).world_size}
    return sorted(t for t in found if t.world_size <= max_ranks and not t.problems(size)
                  and not (local_backend and (t.tp > 1 or t.etp > 1)))


def sample_scenarios(seed: int, count: int, max_ranks: int = DEFAULT_RANKS, tier: str = Tier.GPU_SHARED,
                     patch: str = Patch.NONE, exclude: set[tuple] | None = None,
                     loads_per_save: int = 1, library: str | None = None) -> list[Scenario]:
    """One ordinary scenario per drawn (save, model, recipe), named ``sample-s<seed>-<i>``, with
    its save-only cell and its loads (each scenario has its own model, so its own save).
    ``library``: the ModelOpt release whose recipe library the recipes are drawn from."""
    backend = facts(tier).backend
    recipes = matching.library(library) if library else None
    groups: dict[tuple, list[Draw]] = {}
    for d in draw_cells(seed, count, max_ranks, tier, exclude, loads_per_save, recipes):
        groups.setdefault((d.save, d.size, d.recipe), []).append(d)
    source = f"harness sample --seed {seed}" + (f" --library {library}" if library else "")
    out = []
    for i, ((save, s, recipe), draws) in enumerate(groups.items()):
        out.append(Scenario(
            name=f"sample-s{seed}-{i:03d}",
            description=(f"sampled (seed {seed}): {s.num_layers} layers, {s.num_experts} experts, "
                         f"top-{s.moe_router_topk}{_modules_text(s)}; save {save.id}"
                         + (f"; recipe {recipe}" if recipes else "")),
            tier=tier, backend=backend, patch=patch, expect=ExpectMode.ORACLE, size=s, recipe=recipe,
            saves=(save,), loads=tuple(d.load for d in draws), logits_reference="load-topology",
            stage_timeout_s=300.0, source=source))
    return out


def _modules_text(size: ModelSize) -> str:
    on = [k for k in size.as_dict() if k in MODULE_FIELDS]  # as_dict keeps the modules that are on
    return f"; modules {', '.join(on)}" if on else ""


def slice_of(scenarios: list[Scenario], part: int, parts: int) -> list[Scenario]:
    """Every ``parts``-th sampled scenario from the ``part``-th (1-based): whole save groups, so
    the slices of one draw share no save and together are the draw (``--slice K/N`` spreads one
    sample over several machines or sessions, each within its time limit)."""
    if not 1 <= part <= parts:
        raise ValueError(f"slice {part}/{parts}: want 1 <= K <= N")
    return scenarios[part - 1::parts]


def parse_slice(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N), else one clear line."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--slice {text!r}: want K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise ValueError(f"--slice {text!r}: want 1 <= K <= N")
    return k, n


def describe(scenarios: list[Scenario]) -> str:
    """One line per sampled load cell (``--list``)."""
    return "\n".join(f"{s.name}: save {s.saves[0].id} -> load {l.id}; layers {s.size.num_layers}, "
                     f"experts {s.size.num_experts}, top-{s.size.moe_router_topk}"
                     f"{_modules_text(s.size)}"
                     + (f"; recipe {s.recipe}" if s.recipe != DEFAULT_RECIPE else "")
                     for s in scenarios for l in s.loads)
