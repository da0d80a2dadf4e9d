"""The quarantined jobs and the profile each is judged on (scenarios/quarantine.toml).

Why apart from the verdict: what a job runs (its recipe, its modules, its save topology and
reload grid, the scenarios that stand in for it) is data a job owner edits; the verdict's rules
read it and nothing else.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.paths import QUARANTINE_FILE
from harness.scenario.cells import Cell, Scenario
from harness.topology.topology import Topology

QUARANTINE = QUARANTINE_FILE
# Another profile file (a job owner's own shapes, recipe or grid; the tests' baseline of the
# default recipe): HARNESS_QUARANTINE=<file>, or `verdict --quarantine <file>`.
QUARANTINE_ENV = "HARNESS_QUARANTINE"


def quarantine_path() -> Path:
    import os

    return Path(os.environ.get(QUARANTINE_ENV) or QUARANTINE)


@dataclass(frozen=True)
class Variant:
    """The job judged on another model or load path than its profile's (``[[jobs.profile.also]]``):
    twin scenarios with the job's recipe and save; its own reload grid where it says one."""

    model: str  # what differs, in words
    witness: str
    fix: str = ""  # no patched twin: judged on the witness alone
    loads: tuple[Topology, ...] = ()  # () = the profile's grid


@dataclass(frozen=True)
class Profile:
    """What the job runs, as far as the harness models it: the recipe, the modules, the
    scenarios whose cells stand in for it, and its reload grid (the job's own reload first)."""

    recipe: str  # a recipe reference (harness/model/recipes.py)
    modules: str  # the job's modules, in words: which the evidence models and which it does not
    witness: str  # scenario run unpatched (under every release)
    fix: str  # scenario run with harness.fix (0.47.0)
    loads: tuple[Topology, ...]  # the reload grid at the job's save
    not_modelled: str = ""  # what the job does that no evidence cell does
    also: tuple[Variant, ...] = ()  # the same job judged on other models or load paths


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    pipeline: str
    issue: str
    review_by: str
    failing_stage: str
    save: Topology
    load: Topology
    production: str
    assumption: str
    profile: Profile


@dataclass(frozen=True)
class Quarantine:
    jobs: tuple[Job, ...]
    goldens: str = ""  # the goldens loaded unpatched (existing checkpoints)


class ProfileError(ValueError):
    """A job profile the scenarios cannot stand in for: one line naming the file and key."""


def _profile(j: dict, where: str) -> Profile:
    from harness.model.recipes import Recipe, RecipeError

    raw = j.get("profile")
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: jobs[{j.get('id')}].profile: required table missing")
    try:
        recipe = Recipe.parse(raw["recipe"]).ref
        loads = tuple(Topology.parse(t) for t in raw["loads"])
        also = tuple(_variant(a, i) for i, a in enumerate(raw.get("also", ())))
        return Profile(recipe=recipe, modules=" ".join(raw["modules"].split()),
                       witness=raw["witness_scenario"], fix=raw["fix_scenario"], loads=loads,
                       not_modelled=" ".join(raw.get("not_modelled", "").split()), also=also)
    except KeyError as exc:
        raise ProfileError(f"{where}: jobs[{j.get('id')}].profile.{exc.args[0]}: required key "
                           "missing") from None
    except (RecipeError, ValueError) as exc:
        raise ProfileError(f"{where}: jobs[{j.get('id')}].profile: {exc}") from None


def _variant(a: dict, i: int) -> Variant:
    """``[[jobs.profile.also]]`` entry ``i``; a missing key is named ``also.<i>.<key>``."""
    try:
        return Variant(model=" ".join(a["model"].split()), witness=a["witness_scenario"],
                       fix=a.get("fix_scenario", ""),
                       loads=tuple(Topology.parse(t) for t in a.get("loads", ())))
    except KeyError as exc:
        raise KeyError(f"also.{i}.{exc.args[0]}") from None


def load_quarantine(path: Path | None = None) -> Quarantine:
    from harness.paths import shown_path

    path = Path(path) if path else quarantine_path()
    data = tomllib.loads(path.read_text())
    jobs = tuple(
        Job(
            id=j["id"], name=j["name"], pipeline=j["pipeline"], issue=j["issue"],
            review_by=str(j["review_by"]), failing_stage=j["failing_stage"],
            save=Topology.parse(j["save"]), load=Topology.parse(j["load"]),
            production=f"{j['production_save']} -> {j['production_load']}",
            assumption=" ".join(j.get("assumption", "").split()),
            profile=_profile(j, shown_path(path)),
        )
        for j in data["jobs"]
    )
    return Quarantine(jobs, data.get("goldens_scenario", ""))


def variant_job(job: Job, variant: Variant) -> Job:
    """``job`` with the variant's scenarios (and reload grid) standing in for its profile's."""
    from dataclasses import replace

    return replace(job, profile=replace(job.profile, witness=variant.witness, fix=variant.fix,
                                        loads=variant.loads or job.profile.loads, also=()))


def job_cells(job: Job, scenario: Scenario) -> list[Cell]:
    """The scenario's save-only cell at the job's save and its save -> load cell for every load
    of the job's reload grid; the scenario must quantize with the job's recipe."""
    if scenario.recipe != job.profile.recipe:
        raise ProfileError(f"scenario {scenario.name} quantizes with {scenario.recipe}, job "
                           f"{job.id} with {job.profile.recipe} (scenarios/quarantine.toml)")
    wanted = {t.id for t in job.profile.loads}
    cells = [c for c in scenario.cells() if c.save.id == job.save.id
             and (c.load is None or c.load.id in wanted)]
    have = {c.load.id for c in cells if c.load is not None}
    if have != wanted:
        raise ProfileError(f"scenario {scenario.name} has no cell save={job.save.id} -> "
                           f"load={', '.join(sorted(wanted - have))} for job {job.id}; add the "
                           f"topologies to {Path(scenario.source).name}")
    return cells
