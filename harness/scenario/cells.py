"""Scenarios -> cells (one save topology, optionally one load topology), and what each cell is
expected to do under the rule of a (ModelOpt, megatron-core) pair.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from harness.check.layouts import Restore
from harness.check.recipes import recipe_facts
from harness.model.gpt import ModelSize, default_size
from harness.model.recipes import DEFAULT_RECIPE
from harness.paths import GOLDEN_DIR
from harness.records import ExpectMode, Expected, Patch
from harness.scenario.goldens import golden_layout, golden_topology
from harness.paths import shown_path
from harness.scenario.schema import ScenarioError
from harness.tiers import Backend
from harness.topology import oracle
from harness.topology.topology import Topology


@dataclass(frozen=True)
class KnownGap:
    """Saved keys a load legitimately does not restore, with the reason (shown in reports)."""

    pattern: str
    reason: str

    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern)


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
    logits_reference: str = "save-topology"
    known_gaps: tuple[KnownGap, ...] = ()
    stage_timeout_s: float = 300.0
    markers: tuple[str, ...] = ()
    source: str = ""
    goldens: tuple[str, ...] = ()  # tests/golden/<name>: committed checkpoints instead of saves
    golden_root: Path = GOLDEN_DIR  # where ``goldens`` live (tests point it at copies)
    recipe: str = DEFAULT_RECIPE  # the quantization recipe (harness/model/recipes.py)

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
        scenarios of different sizes in one run never share a save directory."""
        s = self.scenario
        if self.golden:
            return f"golden-{self.golden}"
        import hashlib

        base = f"{s.tier}-{s.backend}-{s.patch}-{self.save.id}"
        if s.recipe != DEFAULT_RECIPE:  # another recipe is another checkpoint
            base += f"-r{hashlib.sha256(s.recipe.encode()).hexdigest()[:8]}"
        if s.size == default_size(s.backend):
            return base
        return f"{base}-m{hashlib.sha256(repr(s.size).encode()).hexdigest()[:8]}"

    @property
    def expected(self) -> str:
        """The expectation under the nvidia-modelopt installed here (see ``expected_under``)."""
        from harness.check.versions import behaviour_for, installed_modelopt

        return self.expected_under(behaviour_for(installed_modelopt()))

    def expected_under(self, behaviour) -> str:
        """pass | fail-save | fail-load | amax-lost | not-restored under one ModelOpt version.

        ``oracle`` mode: an unpatched golden whose layout that version cannot restore expects
        ``not-restored``; then the version's replica rule (the fix's rule when patched,
        harness/topology/oracle.py) for the save, then the load topology; then, unpatched on
        TEGroupedMLP, the second bug where that version has it: every local expert's
        weight-quantizer amax but expert 0's is gone after ``load_state_dict`` whenever a load
        rank holds more than one expert.
        """
        s = self.scenario
        if s.expect == ExpectMode.PASS:
            return Expected.PASS
        if not behaviour.known:
            return Expected.RULE_UNKNOWN  # no rule for the pair: predict nothing
        facts = recipe_facts(s.recipe)
        kind = behaviour.kind_rule(facts.expert_kind) if facts else None
        if kind is None:
            return Expected.RULE_UNKNOWN  # a recipe, or an amax kind, with no rule for the pair
        patched = s.patch == Patch.FIX
        if behaviour.cannot_save and s.backend == Backend.TE:  # every sharded_state_dict call raises
            return Expected.FAIL_LOAD if self.golden else Expected.FAIL_SAVE
        if self.golden and not patched:
            try:
                layout = golden_layout(self.golden, s.golden_root)
            except ScenarioError as exc:  # the file that names the golden is the one to fix
                raise ScenarioError(f"{shown_path(Path(s.source))}: goldens: {exc}", Path(s.source),
                                    s.name) from None
            if behaviour.golden_restore.get(layout) != Restore.RESTORED:
                return Expected.NOT_RESTORED
        rule = "expert-tp" if patched else behaviour.replica_rule
        rule = rule if kind.replica_rule_applies else None
        shared = behaviour.shared_rule if s.backend == Backend.TE else None

        def fails(topo) -> bool:
            return bool((rule and oracle.predicts_failure(topo, rule))
                        or (shared and oracle.shared_collisions(topo, shared)))

        if fails(self.save):
            return Expected.FAIL_SAVE
        if self.load and fails(self.load):
            return Expected.FAIL_LOAD
        if self.load and self.load.etp != self.save.etp and kind.etp_change != Expected.PASS:
            return kind.etp_change or Expected.RULE_UNKNOWN
        if (self.load and not patched and s.backend == Backend.TE
                and kind.lost_on_reload
                and s.size.num_experts // self.load.ep > 1):
            return Expected.AMAX_LOST
        return Expected.PASS

    @property
    def world(self) -> int:
        if self.golden:  # no save stage runs
            return self.load.world_size
        return max(self.save.world_size, self.load.world_size if self.load else 0)
