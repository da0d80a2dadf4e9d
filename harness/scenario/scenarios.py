"""Scenario files (``scenarios/*.toml``) loaded into Scenarios (their cells: harness/scenario/cells.py).

A scenario file is plain data a non-Python reader can follow: tier, model backend, patch, the
save and load topologies, and what outcome to expect. Each file is checked against a schema
(harness/scenario/schema.py: unknown keys, types, allowed values), its topologies against the model's sizes and its goldens
against their manifests, at collection: a bad file becomes one line naming the file, the key and
the constraint, and is skipped without blocking the other files (``load_all_with_errors``).
"""
from __future__ import annotations

import sys
import tomllib
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from harness.check.recipes import STATIC_BLOCK, recipe_forecast
from harness.check.versions import installed_mcore, installed_modelopt, rules_for
from harness.model import modules
from harness.model.gpt import ModelSize, default_size
from harness.model.quant import topology_problems
from harness.model.recipes import EXPERTS, Recipe, RecipeError, recipe_problem
from harness.paths import (GOLDEN_DIR, QUARANTINE_FILE, REPO_ROOT, SCENARIO_DIR, SELECTIONS_FILE,
                           shown_path)
from harness.records import Patch
from harness.scenario.cells import KnownGap, Scenario
from harness.scenario.goldens import golden_manifest, golden_topology
from harness.scenario.schema import ScenarioError, _explain, _ScenarioSchema, _SizeSchema
from harness.tiers import Tier, on_cuda
from harness.topology.topology import Topology, TopologyError


def _topologies(raw: list[str], size: ModelSize, backend: str, key: str, problems: list[str],
                unique: bool = True) -> tuple[Topology, ...]:
    out, seen = [], {}
    for i, text in enumerate(raw):
        try:
            topo = Topology.parse(text).check(size)
        except TopologyError as exc:
            problems.append(f"{key}[{i}]: {exc}")
            continue
        refused = topology_problems(topo, backend)
        if refused:
            problems.append(f"{key}[{i}]: topology {topo.id} cannot run: " + "; ".join(refused))
            continue
        if unique and topo in seen:
            problems.append(f"{key}[{i}]: {topo.id} is listed twice (also {key}[{seen[topo]}])")
        seen.setdefault(topo, i)
        out.append(topo)
    return tuple(out)


def _golden_size(names: list[str], golden_dir: Path, problems: list[str]) -> dict | None:
    """The one model size the goldens record (a load stage must build that model)."""
    sizes = []
    for i, n in enumerate(names):
        try:
            raw = golden_manifest(n, golden_dir).get("size")
            golden_topology(n, golden_dir)
        except ScenarioError as exc:
            problems.append(f"goldens[{i}]: {exc}")
            continue
        if not isinstance(raw, dict) or not raw:
            problems.append(f"goldens[{i}]: golden {n!r}: manifest.json records no model size")
            continue
        try:
            _SizeSchema.model_validate(raw)
        except ValidationError as exc:
            problems += [f"goldens[{i}]: golden {n!r}: manifest.json size.{_explain(e, _SizeSchema)}"
                         for e in exc.errors(include_url=False)]
            continue
        sizes.append(raw)
    if problems:
        return None
    if any(sz != sizes[0] for sz in sizes):
        problems.append(f"goldens: {names} must record one and the same model size")
        return None
    return sizes[0]


class _Problems(Exception):
    """Problems found in one file after the schema passed, already joined into one line."""


def _check(doc: _ScenarioSchema, golden_dir: Path) -> tuple[ModelSize, dict]:
    """What the schema cannot say: keys that exclude each other, sizes, topologies, goldens."""
    problems: list[str] = []
    if doc.goldens:
        problems += [f"{k}: a scenario has either saves or goldens, not both ({k} with goldens)"
                     for k in ("saves", "pairs") if getattr(doc, k)]
        if doc.model is not None:
            problems.append("model: not allowed with goldens (the goldens' manifests fix the size)")
        if not doc.loads:
            problems.append("loads: required with goldens (a golden cell is a load)")
        dupes = sorted({g for g in doc.goldens if doc.goldens.count(g) > 1})
        if dupes:
            problems.append(f"goldens: {dupes[0]!r} is listed twice")
    elif not doc.saves and not doc.pairs:
        problems.append("saves: required (or goldens, or pairs): without them the scenario has no cells")
    if problems:
        raise _Problems("; ".join(problems))
    base = default_size(doc.backend).as_dict()
    if doc.goldens:
        over = _golden_size(doc.goldens, golden_dir, problems)
    else:
        over = doc.model.model_dump(exclude_none=True) if doc.model else {}
    if problems:
        raise _Problems("; ".join(problems))
    size = ModelSize(**{**base, **over})
    problems += modules.problems(size, doc.backend)
    where = "goldens" if doc.goldens else "model"  # where the size came from
    problems += [f"{where}: {p}" for p in size.problems()]
    topos = {k: _topologies(getattr(doc, k), size, doc.backend, k, problems)
             for k in ("saves", "loads")}
    pairs = []
    for i, pair in enumerate(doc.pairs):
        got = _topologies(pair, size, doc.backend, f"pairs[{i}]", problems, unique=False)
        if len(got) == 2:
            pairs.append(got)
    topos["pairs"] = tuple(pairs)
    saved = [(f"saves[{i}]", t) for i, t in enumerate(topos["saves"])]
    saved += [(f"pairs[{i}][0]", p[0]) for i, p in enumerate(pairs)]
    parts = tuple(doc.fix_parts) if doc.patch == Patch.FIX else ()
    problems += _recipe_problems(doc.recipe, doc.tier, saved, parts)
    if doc.fix_parts and doc.patch != Patch.FIX:
        problems.append(f"fix_parts: {doc.fix_parts} asks harness.fix for parts, which only a "
                        f"patched stage applies: needs patch = 'fix', not {doc.patch!r}")
    if len(set(doc.fix_parts)) != len(doc.fix_parts):
        problems.append(f"fix_parts: {doc.fix_parts} names a part twice")
    problems += strictness_problems(doc.dist_ckpt_strictness)
    if doc.shared_gpu_nccl and doc.tier != Tier.GPU:
        problems.append(f"shared_gpu_nccl: true needs tier 'gpu' (NCCL ranks); tier {doc.tier!r} "
                        "runs gloo ranks, which share GPUs already")
    if not on_cuda(doc.tier):  # the save calibrates through megatron-core's pipeline schedule
        problems += [f"{key}: {t.id}: a save at pp > 1 calibrates through megatron-core's pipeline "
                     "schedule, which allocates its receive buffers on CUDA: tiers gpu-shared "
                     "and gpu only"
                     for key, t in saved if t.pp > 1]
    if problems:
        raise _Problems("; ".join(problems))
    return size, topos


def strictness_problems(value: str) -> list[str]:
    """``dist_ckpt_strictness`` is one of the installed megatron-core's StrictHandling values."""
    from harness.model.checkpoint import strictness_values

    known = strictness_values()
    if value in known:
        return []
    return [f"dist_ckpt_strictness: {value!r} is not one of megatron-core's StrictHandling values "
            f"({', '.join(known)})"]


def _recipe_problems(text: str, tier: str, saved: list[tuple[str, Topology]],
                     fix_parts: tuple[str, ...] = ()) -> list[str]:
    """The recipe names one (harness/model/recipes.py), the installed ModelOpt has it, and no
    save asks ModelOpt to calibrate what it cannot: static NVFP4 experts at expert TP > 1
    (refused by ModelOpt; allowed where the fix's part (f) is asked for, ``fix_parts``:
    harness/check/versions.py kind_rule), or off CUDA (its static block fake quantization needs triton on a GPU:
    "RuntimeError static_blockwise_fp4_fake_quant requires triton", seen on the cpu tier)."""
    try:
        recipe = Recipe.parse(text)
    except RecipeError as exc:
        return [f"recipe: {exc}"]
    missing = recipe_problem(recipe, REPO_ROOT)
    if missing:
        return [f"recipe: {missing}"]
    static = STATIC_BLOCK in (recipe_forecast(recipe.ref, installed_modelopt()) or {}).get(EXPERTS, [])
    if static and not on_cuda(tier):
        return [f"recipe: {recipe.label} calibrates static NVFP4 experts, whose fake quantization "
                f"runs on CUDA only: tiers gpu-shared and gpu, not {tier}"]
    kind = rules_for(installed_modelopt(), installed_mcore()).kind_rule(STATIC_BLOCK, EXPERTS, fix_parts) if static else None
    refusal = kind.save_refused_split if kind else None
    return [f"{key}: {t.id}: recipe {recipe.label} calibrates static NVFP4 experts, which "
            f"nvidia-modelopt refuses at expert TP > 1 ({refusal}); save at etp1"
            for key, t in saved if refusal and t.etp > 1]


def load_scenario(path: Path, golden_dir: Path = GOLDEN_DIR) -> Scenario:
    """One file -> a Scenario, or ScenarioError with one line naming the file, key and constraint."""
    path = Path(path)
    where = shown_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: invalid TOML: {exc}", path, path.stem) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{where}: cannot read ({type(exc).__name__}: {exc})", path, path.stem) from None
    name = data.get("name") if isinstance(data.get("name"), str) else path.stem
    try:
        doc = _ScenarioSchema.model_validate(data)
    except ValidationError as exc:
        why = "; ".join(_explain(e) for e in exc.errors(include_url=False))
        raise ScenarioError(f"{where}: {why}", path, name) from None
    try:
        size, topos = _check(doc, Path(golden_dir))
    except _Problems as exc:
        raise ScenarioError(f"{where}: {exc}", path, name) from None
    return Scenario(
        name=doc.name or path.stem,
        description=doc.description.strip(),
        tier=doc.tier,
        backend=doc.backend,
        patch=doc.patch,
        expect=doc.expect,
        size=size,
        saves=topos["saves"],
        loads=topos["loads"],
        pairs=topos["pairs"],
        singleton_local_shards=doc.singleton_local_shards,
        strict_load=doc.strict_load,
        dist_ckpt_strictness=doc.dist_ckpt_strictness,
        megatron_lm_load=doc.megatron_lm_load,
        logits_reference=doc.logits_reference,
        known_gaps=tuple(KnownGap(g.pattern, g.reason) for g in doc.known_gaps),
        stage_timeout_s=float(doc.stage_timeout_s),
        markers=tuple(doc.markers),
        source=str(path),
        goldens=tuple(doc.goldens),
        golden_root=Path(golden_dir),
        recipe=Recipe.parse(doc.recipe).ref,
        shared_gpu_nccl=doc.shared_gpu_nccl,
        fix_parts=tuple(doc.fix_parts),
    )


# Data files kept beside the scenarios that are not scenarios (harness/report/verdict.py and
# harness/scenario/selections.py read them).
NOT_SCENARIOS = (QUARANTINE_FILE.name, SELECTIONS_FILE.name)


def _names(directory: Path) -> dict[Path, str]:
    """Each scenario file of ``directory`` (sorted) -> its scenario's name (its ``name`` key, else
    its stem), read without checking the rest of the file."""
    names = {}
    for p in sorted(Path(directory).glob("*.toml")):
        if p.name in NOT_SCENARIOS:
            continue
        try:
            name = tomllib.loads(p.read_text(encoding="utf-8")).get("name")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            name = None  # load_scenario names the problem
        names[p] = name if isinstance(name, str) else p.stem
    return names


def name_clashes(directory: Path | None = None) -> list[str]:
    """One line per scenario name that two or more files of ``directory`` carry, naming them all.

    Why: a name picks a scenario's cells (``make repro``, ``--scenario``); a new file that reuses
    a shipped name once replaced the shipped grid silently (the later file was the one skipped)."""
    by_name: dict[str, list[Path]] = {}
    for path, name in _names(directory or SCENARIO_DIR).items():
        by_name.setdefault(name, []).append(path)
    return [f"scenario name {name!r} is used by {' and '.join(shown_path(p) for p in paths)}: "
            "one name, one file; rename the new one" for name, paths in by_name.items()
            if len(paths) > 1]


def load_all_with_errors(directory: Path | None = None, golden_dir: Path = GOLDEN_DIR
                         ) -> tuple[list[Scenario], list[ScenarioError]]:
    """Every good scenario, and one ScenarioError per bad file: a bad file never hides the others.

    Names are unique across files: every file of a name two files carry is bad (each line names
    the other files), so neither grid runs in place of the other.
    """
    good: list[Scenario] = []
    bad: list[ScenarioError] = []
    names = _names(directory or SCENARIO_DIR)
    for p, name in names.items():
        others = [q for q, n in names.items() if n == name and q != p]
        if others:
            bad.append(ScenarioError(f"{shown_path(p)}: name: {name!r} is also used by "
                                     f"{', '.join(shown_path(q) for q in others)}", p, name))
            continue
        try:
            good.append(load_scenario(p, golden_dir))
        except ScenarioError as exc:
            bad.append(exc)
    return good, bad


_REPORTED: set[str] = set()


def report_errors(errors: list[ScenarioError], stream=None) -> None:
    """Print each bad file's line once per process (load_all runs many times in one command)."""
    for exc in errors:
        if str(exc) not in _REPORTED:
            _REPORTED.add(str(exc))
            print(f"scenario file skipped: {exc}", file=stream or sys.stderr)


def scenario_name(asked: str, good: list[Scenario], bad: list[ScenarioError]) -> str:
    """The scenario ``--scenario asked`` names: a scenario's name, or the path of its file in
    the scenario directory (``scenarios/cpu_reshard.toml``); else ScenarioError, one line with
    the known names and the closest one. A bad file's name is returned: its own line says why."""
    import difflib

    names = {s.name: Path(s.source) for s in good} | {e.name: e.path for e in bad if e.name}
    if asked in names:
        return asked
    path = Path(asked)
    for name, source in names.items():
        if source is not None and path.suffix == ".toml" and path.is_file() \
                and path.resolve() == Path(source).resolve():
            return name
    stems = {Path(p).stem: n for n, p in names.items() if p is not None}
    close = difflib.get_close_matches(path.stem if path.suffix else asked, [*names, *stems], n=1)
    hint = f"did you mean {stems.get(close[0], close[0])!r}? " if close else ""
    what = "not a scenario file" if path.suffix == ".toml" and path.is_file() else "no such scenario"
    raise ScenarioError(f"--scenario {asked!r}: {what} ({hint}known: {', '.join(sorted(names))}; "
                        "or the path of one of their files)")


def as_nccl_shared(s: Scenario) -> Scenario | str:
    """``s`` run as tier gpu with NCCL ranks sharing GPUs (``run --nccl-shared-gpu``), keeping its
    name so its cells compare one for one with the gloo run of the same scenario; or why not."""
    if s.tier == Tier.CPU:
        return (f"{shown_path(Path(s.source))}: tier 'cpu' runs gloo ranks on CPU; "
                "--nccl-shared-gpu needs a GPU tier (gpu-shared or gpu)")
    return replace(s, tier=Tier.GPU, shared_gpu_nccl=True)


def load_all(directory: Path | None = None, golden_dir: Path = GOLDEN_DIR) -> list[Scenario]:
    """The good scenarios; each bad file's line goes to stderr (load_all_with_errors returns them)."""
    good, bad = load_all_with_errors(directory, golden_dir)
    report_errors(bad)
    return good
