"""Scenarios -> cells (one save topology, optionally one load topology), each planned once into
the facts its expectation and its judging read (harness/check/plan.py ``CellPlan``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from harness.check.gaps import KnownGap, known_gaps
from harness.check.plan import CellPlan
from harness.model.checkpoint import DEFAULT_STRICTNESS
from harness.model.gpt import ModelSize, default_size
from harness.model.recipes import DEFAULT_RECIPE, model_families
from harness.paths import GOLDEN_DIR, shown_path
from harness.records import ExpectMode, Patch
from harness.scenario.goldens import golden_layout, golden_topology
from harness.scenario.schema import ScenarioError
from harness.topology.topology import Topology

__all__ = ["Cell", "CellPlan", "KnownGap", "Scenario"]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    tier: str
    backend: str
    patch: str
    expect: str
    size: ModelSize
    saves: tuple[Topology, ...]
    loads: tuple[Topology, ...]
    pairs: tuple[tuple[Topology, Topology], ...] = ()
    singleton_local_shards: bool = True
    strict_load: bool = True
    # megatron-core's StrictHandling for dist_checkpointing.load (Megatron-LM's
    # --dist-ckpt-strictness; the Nano QAD example reloads with log_all)
    dist_ckpt_strictness: str = DEFAULT_STRICTNESS
    # model.load_state_dict as Megatron-LM's load_checkpoint: strict, then non-strict on error
    megatron_lm_load: bool = False
    logits_reference: str = "save-topology"
    known_gaps: tuple[KnownGap, ...] = ()  # the file's own; the judge adds the backend's (check/gaps.py)
    stage_timeout_s: float = 300.0
    markers: tuple[str, ...] = ()
    source: str = ""
    goldens: tuple[str, ...] = ()  # tests/golden/<name>: committed checkpoints instead of saves
    golden_root: Path = GOLDEN_DIR  # where ``goldens`` live (tests point it at copies)
    recipe: str = DEFAULT_RECIPE  # the quantization recipe (harness/model/recipes.py)
    # tier gpu only: NCCL ranks may share GPUs, each its own host (harness/rank/shared_gpu.py)
    shared_gpu_nccl: bool = False
    # patch fix only: the parts of the fix its proof needs (moe_ckpt_fix PARTS, e.g.
    # "static-block": part f): a release whose fix lacks one skips the cell
    # (harness/check/decision.py); an unproven part is asked for by name (harness/run/cell.py fix_env)
    fix_parts: tuple[str, ...] = ()

    def cells(self) -> list["Cell"]:
        if self.goldens:
            topos = {g: golden_topology(g, self.golden_root) for g in self.goldens}
            return [Cell(self, topos[g], l, golden=g) for g in self.goldens for l in self.loads]
        out = [Cell(self, s, None) for s in self.saves]
        pairs = [(s, l) for s in self.saves for l in self.loads] + list(self.pairs)
        out += [Cell(self, s, l) for s, l in pairs]
        return out


@dataclass(frozen=True)
class Cell:
    scenario: Scenario
    save: Topology
    load: Topology | None
    golden: str = ""  # set: the "save" is this committed golden checkpoint, not a save stage

    @property
    def id(self) -> str:
        tail = f"load={self.load.id}" if self.load else "save-only"
        head = f"golden={self.golden}" if self.golden else f"save={self.save.id}"
        return f"{self.scenario.name}[{head},{tail}]"

    @property
    def save_id(self) -> str:
        """Cells that share a save (same scenario settings, model size and topology) share one
        checkpoint; a model size other than the backend's default is part of the id, so two
        scenarios of different sizes in one run never share a save directory. So is every other
        setting the save stage reads (its sharded layout, its reference reload): the Nano job's
        plain-shards scenario once shared the singleton-shards scenario's save."""
        s = self.scenario
        if self.golden:
            return f"golden-{self.golden}"
        import hashlib

        base = f"{s.tier}-{s.backend}-{s.patch}-{self.save.id}"
        if s.recipe != DEFAULT_RECIPE:  # another recipe is another checkpoint
            base += f"-r{hashlib.sha256(s.recipe.encode()).hexdigest()[:8]}"
        if not s.singleton_local_shards:
            base += "-plain-shards"
        if not s.strict_load:
            base += "-non-strict"
        if s.fix_parts:  # another patch is another checkpoint
            base += "-fix-" + "-".join(s.fix_parts)
        if s.size == default_size(s.backend):
            return base
        return f"{base}-m{hashlib.sha256(repr(s.size).encode()).hexdigest()[:8]}"

    @property
    def expected(self) -> str:
        """The expectation under the nvidia-modelopt installed here (see ``expected_under``)."""
        from harness.check.versions import installed_mcore, installed_modelopt, rules_for

        return self.expected_under(rules_for(installed_modelopt(), installed_mcore()))

    def expected_under(self, behaviour) -> str:
        """The expectation rule (harness/check/expectation.py) on this cell's plan."""
        from harness.check.expectation import expected

        return expected(self.plan, behaviour)

    @functools.cached_property
    def plan(self) -> CellPlan:
        """This cell's facts, fixed once (harness/check/plan.py): what the judge reads. An
        unpatched golden's layout is read here: a golden that cannot be read names the scenario
        file that names it."""
        s = self.scenario
        layout = None
        if self.golden and s.patch != Patch.FIX and s.expect != ExpectMode.PASS:
            try:
                layout = golden_layout(self.golden, s.golden_root)
            except ScenarioError as exc:  # the file that names the golden is the one to fix
                raise ScenarioError(f"{shown_path(Path(s.source))}: goldens: {exc}", Path(s.source),
                                    s.name) from None
        return CellPlan(
            id=self.id, scenario=s.name, tier=s.tier, backend=s.backend, patch=s.patch,
            recipe=s.recipe, expect=s.expect, save=self.save, load=self.load,
            num_experts=s.size.num_experts, golden=self.golden, golden_layout=layout,
            golden_ckpt=s.golden_root / self.golden / "ckpt" if self.golden else None,
            known_gaps=known_gaps(s),
            families=model_families(s.size.moe_shared_expert_intermediate_size is not None),
            fix_parts=s.fix_parts,
            mtp_num_layers=s.size.mtp_num_layers, position_embedding=s.size.position_embedding,
        )

    @property
    def world(self) -> int:
        return self.plan.world
