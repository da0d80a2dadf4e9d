"""The quarantined jobs and the profile each is judged on (scenarios/quarantine.toml).

Why apart from the verdict: what a job runs (its recipe, its modules, its save topology and
reload grid, the scenarios that stand in for it) is data a job owner edits; the verdict's rules
read it and nothing else.
"""
from __future__ import annotations

import datetime
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Mapping

from pydantic import BeforeValidator, Field, ValidationError

from harness.paths import QUARANTINE_FILE
from harness.scenario.cells import Cell, Scenario
from harness.scenario.schema import Name, Text, _explain, _Schema
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
    where: str = ""  # its place in the profile file, for error lines: "<file>: jobs[<i>]"


@dataclass(frozen=True)
class Quarantine:
    jobs: tuple[Job, ...]
    goldens: str = ""  # the goldens loaded unpatched (existing checkpoints)


class ProfileError(ValueError):
    """A job profile the scenarios cannot stand in for: one line naming the file and key."""


def _date_as_text(value):
    return value.isoformat() if isinstance(value, datetime.date) else value


class _VariantSchema(_Schema):
    model: Text
    witness_scenario: Name
    fix_scenario: str = ""
    loads: list[Text] = []


class _ProfileSchema(_Schema):
    recipe: Text
    modules: Text
    not_modelled: str = ""
    witness_scenario: Name
    fix_scenario: Name
    loads: Annotated[list[Text], Field(min_length=1)]
    also: list[_VariantSchema] = []


class _JobSchema(_Schema):
    id: Name
    name: Text
    pipeline: Text
    issue: Text
    filed_from: str = ""
    quarantined_since: str = ""
    review_by: Annotated[Text, BeforeValidator(_date_as_text)]  # a TOML date or a string
    failing_stage: Literal["save", "load"]
    production_save: Text
    production_load: Text
    save: Text
    load: Text
    assumption: str = ""
    profile: _ProfileSchema


class _QuarantineSchema(_Schema):
    """What a quarantine file may say: checked as a scenario file is (harness/scenario/schema.py)."""

    goldens_scenario: str = ""
    jobs: Annotated[list[_JobSchema], Field(min_length=1)]


def _topology(text: str, key: str, problems: list[str]) -> Topology | None:
    try:
        return Topology.parse(text)
    except ValueError as exc:
        problems.append(f"{key}: {exc}")
        return None


def _job(where: str, i: int, j: _JobSchema, problems: list[str]) -> Job | None:
    """The job of ``jobs[i]`` in the file ``where``; what the schema cannot say (topologies, the
    recipe) goes to ``problems``."""
    from harness.model.recipes import Recipe, RecipeError

    key = f"jobs[{i}]"
    save, load = (_topology(getattr(j, k), f"{key}.{k}", problems) for k in ("save", "load"))
    loads = [_topology(t, f"{key}.profile.loads[{n}]", problems) for n, t in enumerate(j.profile.loads)]
    also = [Variant(model=" ".join(a.model.split()), witness=a.witness_scenario, fix=a.fix_scenario,
                    loads=tuple(_topology(t, f"{key}.profile.also[{n}].loads[{m}]", problems)
                                for m, t in enumerate(a.loads)))
            for n, a in enumerate(j.profile.also)]
    try:
        recipe = Recipe.parse(j.profile.recipe).ref
    except RecipeError as exc:
        problems.append(f"{key}.profile.recipe: {exc}")
        return None
    if save is None or load is None or None in loads or any(None in a.loads for a in also):
        return None
    return Job(
        id=j.id, name=j.name, pipeline=j.pipeline, issue=j.issue, review_by=j.review_by,
        failing_stage=j.failing_stage, save=save, load=load,
        production=f"{j.production_save} -> {j.production_load}",
        assumption=" ".join(j.assumption.split()), where=f"{where}: {key}",
        profile=Profile(recipe=recipe, modules=" ".join(j.profile.modules.split()),
                        witness=j.profile.witness_scenario, fix=j.profile.fix_scenario,
                        loads=tuple(loads), not_modelled=" ".join(j.profile.not_modelled.split()),
                        also=tuple(also)))


def load_quarantine(path: Path | None = None) -> Quarantine:
    """The jobs of the quarantine file, or ProfileError: one line naming the file, the key and
    the constraint (a typo'd key with the closest allowed one), as for a scenario file."""
    from harness.paths import shown_path

    path = Path(path) if path else quarantine_path()
    where = shown_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{where}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{where}: cannot read ({type(exc).__name__}: "
                           f"{getattr(exc, 'strerror', None) or exc})") from None
    try:
        doc = _QuarantineSchema.model_validate(data)
    except ValidationError as exc:
        why = "; ".join(_explain(e, _QuarantineSchema) for e in exc.errors(include_url=False))
        raise ProfileError(f"{where}: {why}") from None
    problems: list[str] = []
    jobs = [_job(where, i, j, problems) for i, j in enumerate(doc.jobs)]
    seen: dict[str, int] = {}
    for i, j in enumerate(doc.jobs):
        if j.id in seen:
            problems.append(f"jobs[{i}].id: {j.id!r} is already the id of jobs[{seen[j.id]}]")
        seen.setdefault(j.id, i)
    if problems:
        raise ProfileError(f"{where}: " + "; ".join(problems))
    return Quarantine(tuple(jobs), doc.goldens_scenario)


def stand_ins(job: Job, by_name: Mapping[str, Scenario]) -> tuple[Scenario, Scenario | None]:
    """The job's witness and fix scenarios (None: a variant with no patched twin); ProfileError
    names the key and the closest name."""
    import difflib

    out = []
    for key, name in (("witness_scenario", job.profile.witness), ("fix_scenario", job.profile.fix)):
        if not name and key == "fix_scenario":
            out.append(None)
            continue
        if name not in by_name:
            close = difflib.get_close_matches(name, list(by_name), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ProfileError(f"{job.where}.profile.{key}: no scenario {name!r}{hint}")
        out.append(by_name[name])
    return out[0], out[1]


def by_kinds(job: Job, scenario: Scenario) -> bool:
    """Whether ``scenario`` stands in for ``job`` by the amax kinds its recipe makes rather than by
    its recipe's name: the job's recipe is a job owner's own file (``file:``) and the scenario
    quantizes with another. The verdict then takes only records whose kinds are the file's
    (harness/report/verdict.py of_the_kinds) and judges them by them."""
    return scenario.recipe != job.profile.recipe and job.profile.recipe.startswith("file:")


def file_recipe_kinds(job: Job) -> dict[str, list[str]]:
    """The amax kinds, per module family, the job's own recipe file configures the weight
    quantizers for, by ModelOpt's own matching on the cpu tier's model (the recipe survey's
    forecast, harness/rank/recipe_survey.py configured_kinds); ProfileError when ModelOpt cannot
    read the file or it quantizes no routed-expert weight."""
    return _survey_kinds(job.profile.recipe, job.where)


_KINDS_CACHE: dict[str, dict[str, list[str]]] = {}


def _survey_kinds(ref: str, where: str) -> dict[str, list[str]]:
    if ref not in _KINDS_CACHE:
        from harness.rank import recipe_survey

        try:
            (row,) = recipe_survey.in_own_process([ref], forecast_only=True, timeout_s=300.0)["rows"]
        except RuntimeError as exc:
            raise ProfileError(f"{where}.profile.recipe: {ref}: {exc}") from None
        if "forecast" not in row:
            raise ProfileError(f"{where}.profile.recipe: {ref}: {row.get('left_out') or 'no forecast'}")
        _KINDS_CACHE[ref] = row["forecast"]
    return _KINDS_CACHE[ref]


def job_cells(job: Job, scenario: Scenario) -> list[Cell]:
    """The scenario's save-only cell at the job's save and its save -> load cell for every load
    of the job's reload grid; the scenario must quantize with the job's recipe, or, for a job
    owner's recipe file, may quantize with another (``by_kinds``: the kinds decide)."""
    if scenario.recipe != job.profile.recipe and not by_kinds(job, scenario):
        raise ProfileError(f"{job.where}.profile.recipe: job {job.id} quantizes with "
                           f"{job.profile.recipe}, its scenario {scenario.name} with {scenario.recipe}")
    if by_kinds(job, scenario):
        file_recipe_kinds(job)  # read and checked here: a file ModelOpt cannot read stops the verdict
    wanted = {t.id for t in job.profile.loads}
    cells = [c for c in scenario.cells() if c.save.id == job.save.id
             and (c.load is None or c.load.id in wanted)]
    have = {c.load.id for c in cells if c.load is not None}
    if have != wanted:
        raise ProfileError(f"{job.where}: scenario {scenario.name} has no cell save={job.save.id}"
                           f" -> load={', '.join(sorted(wanted - have))} for job {job.id}; add the "
                           f"topologies to {Path(scenario.source).name}")
    return cells


def variant_job(job: Job, variant: Variant) -> Job:
    """``job`` with the variant's scenarios (and reload grid) standing in for its profile's."""
    from dataclasses import replace

    return replace(job, profile=replace(job.profile, witness=variant.witness, fix=variant.fix,
                                        loads=variant.loads or job.profile.loads, also=()))


def deciding_scenarios() -> set[str]:
    """The scenarios whose cells decide a quarantined job's verdict (scenarios/quarantine.toml:
    each job's witness and fix scenarios and their variants, and the goldens)."""
    q = load_quarantine()
    names = {q.goldens}
    for job in q.jobs:
        names |= {job.profile.witness, job.profile.fix}
        names |= {n for v in job.profile.also for n in (v.witness, v.fix)}
    return {n for n in names if n}
