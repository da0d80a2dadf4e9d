"""Scenario files (``scenarios/*.toml``) -> cells: one save topology, optionally one load topology.

A scenario file is plain data a non-Python reader can follow: tier, model backend, patch, the
save and load topologies, and what outcome to expect. Topologies are checked against the
model's sizes here, at collection, so a bad grid fails with the broken constraint named.
"""
from __future__ import annotations

import fnmatch
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.topology import oracle
from harness.model.gpt import CPU_SIZE, GPU_SIZE, ModelSize
from harness.paths import GOLDEN_DIR, QUARANTINE_FILE, SCENARIO_DIR
from harness.topology.topology import Topology, TopologyError

EXPECT_MODES = ("pass", "oracle")


class ScenarioError(ValueError):
    pass


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
    known_gaps: tuple[KnownGap, ...] = ()
    stage_timeout_s: float = 300.0
    markers: tuple[str, ...] = ()
    source: str = ""
    goldens: tuple[str, ...] = ()  # tests/golden/<name>: committed checkpoints instead of saves

    def cells(self) -> list["Cell"]:
        if self.goldens:
            topos = {g: golden_topology(g) for g in self.goldens}  # one manifest read each
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
        """Cells that share a save (same scenario settings and topology) share one checkpoint."""
        s = self.scenario
        if self.golden:
            return f"golden-{self.golden}"
        return f"{s.tier}-{s.backend}-{s.patch}-{self.save.id}"

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
        if s.expect == "pass":
            return "pass"
        patched = s.patch == "fix"
        if (self.golden and not patched
                and behaviour.golden_restore.get(golden_layout(self.golden)) != "restored"):
            return "not-restored"
        rule = "fixed" if patched else behaviour.replica_rule
        if rule and oracle.predicts_failure(self.save, rule):
            return "fail-save"
        if rule and self.load and oracle.predicts_failure(self.load, rule):
            return "fail-load"
        if (self.load and not patched and s.backend == "te"
                and behaviour.drops_expert_amax_on_reload
                and s.size.num_experts // self.load.ep > 1):
            return "amax-lost"
        return "pass"

    @property
    def world(self) -> int:
        if self.golden:  # no save stage runs
            return self.load.world_size
        return max(self.save.world_size, self.load.world_size if self.load else 0)


def golden_manifest(name: str) -> dict:
    from harness.golden.manifest import read_manifest

    return read_manifest(GOLDEN_DIR / name)


def golden_topology(name: str) -> Topology:
    return Topology.parse(golden_manifest(name)["topology"])


@functools.lru_cache(maxsize=None)
def golden_layout(name: str) -> str:
    """complete | shared | incomplete, from the golden's metadata (python -m harness inspect).

    Unpatched 0.47.0 cannot restore a shared (<= 0.46) or incomplete checkpoint: those cells
    expect ``not-restored`` (the load raises, or the loaded state differs from the checkpoint).
    """
    from harness.golden.inspect import inspect_checkpoint

    lay = inspect_checkpoint(GOLDEN_DIR / name / "ckpt")
    if lay.kind == "shared":
        return "shared"
    return "incomplete" if lay.missing or lay.kind != "per-expert" else "complete"


def _golden_size(names: list[str], where: str) -> dict:
    sizes = []
    for n in names:
        if not (GOLDEN_DIR / n / "manifest.json").is_file():
            raise ScenarioError(f"{where}: golden {n!r} not found under {GOLDEN_DIR}")
        sizes.append(golden_manifest(n).get("size") or {})
    if any(sz != sizes[0] for sz in sizes) or not sizes[0]:
        raise ScenarioError(f"{where}: goldens {names} must record one and the same model size")
    return sizes[0]


def _topologies(raw, size: ModelSize, where: str) -> tuple[Topology, ...]:
    out = []
    for text in raw:
        try:
            out.append(Topology.parse(text).check(size))
        except TopologyError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
    return tuple(out)


def load_scenario(path: Path) -> Scenario:
    data = tomllib.loads(path.read_text())
    where = path.name
    try:
        tier, backend = data["tier"], data["backend"]
    except KeyError as exc:
        raise ScenarioError(f"{where}: missing required field {exc}") from None
    if data.get("expect", "oracle") not in EXPECT_MODES:
        raise ScenarioError(f"{where}: expect must be one of {EXPECT_MODES}")
    goldens = list(data.get("goldens", []))
    if goldens and data.get("saves"):
        raise ScenarioError(f"{where}: a scenario has either saves or goldens, not both")
    size = ModelSize(**{**(CPU_SIZE if backend == "local" else GPU_SIZE).as_dict(),
                        **data.get("model", {}),
                        **(_golden_size(goldens, where) if goldens else {})})
    pairs = tuple(
        (_topologies([s], size, where)[0], _topologies([l], size, where)[0])
        for s, l in data.get("pairs", [])
    )
    return Scenario(
        name=data.get("name", path.stem),
        description=data.get("description", "").strip(),
        tier=tier,
        backend=backend,
        patch=data.get("patch", "none"),
        expect=data.get("expect", "oracle"),
        size=size,
        saves=_topologies(data.get("saves", []), size, where),
        loads=_topologies(data.get("loads", []), size, where),
        pairs=pairs,
        singleton_local_shards=data.get("singleton_local_shards", True),
        strict_load=data.get("strict_load", True),
        known_gaps=tuple(KnownGap(**g) for g in data.get("known_gaps", [])),
        stage_timeout_s=float(data.get("stage_timeout_s", 300)),
        markers=tuple(data.get("markers", [])),
        source=str(path),
        goldens=tuple(goldens),
    )


# Data files kept beside the scenarios that are not scenarios (harness/report/verdict.py reads this one).
NOT_SCENARIOS = (QUARANTINE_FILE.name,)


def load_all(directory: Path = SCENARIO_DIR) -> list[Scenario]:
    return [load_scenario(p) for p in sorted(directory.glob("*.toml")) if p.name not in NOT_SCENARIOS]
