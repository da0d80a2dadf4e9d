"""Scenario files (``scenarios/*.toml``) -> cells: one save topology, optionally one load topology.

A scenario file is plain data a non-Python reader can follow: tier, model backend, patch, the
save and load topologies, and what outcome to expect. Each file is checked against a schema
(unknown keys, types, allowed values), its topologies against the model's sizes and its goldens
against their manifests, at collection: a bad file becomes one line naming the file, the key and
the constraint, and is skipped without blocking the other files (``load_all_with_errors``).
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from harness.check.layouts import GoldenLayout, Restore, golden_layout_of
from harness.check.logits import LOGITS_REFERENCES
from harness.topology import oracle
from harness.golden.manifest import GoldenError, verify_manifest
from harness.model.gpt import ModelSize, default_size
from harness.paths import GOLDEN_DIR, QUARANTINE_FILE, REPO_ROOT, SCENARIO_DIR, SELECTIONS_FILE
from harness.records import EXPECT_MODES, ExpectMode, Expected
from harness.tiers import BACKENDS, TIERS, Backend, on_cuda
from harness.topology.topology import Topology, TopologyError

PATCHES = ("none", "fix")


class ScenarioError(ValueError):
    """One bad scenario file, as one line: ``<file>: <key>: <constraint>``.

    ``path`` and ``name`` (the scenario's name, or the file's stem) let callers show or select it.
    """

    def __init__(self, message: str, path: Path | None = None, name: str | None = None):
        super().__init__(" ".join(str(message).split()))  # one line, whatever the cause said
        self.path = path
        self.name = name


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
        base = f"{s.tier}-{s.backend}-{s.patch}-{self.save.id}"
        if s.size == default_size(s.backend):
            return base
        import hashlib

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
        patched = s.patch == "fix"
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
        shared = behaviour.shared_rule if s.backend == Backend.TE else None

        def fails(topo) -> bool:
            return bool((rule and oracle.predicts_failure(topo, rule))
                        or (shared and oracle.shared_collisions(topo, shared)))

        if fails(self.save):
            return Expected.FAIL_SAVE
        if self.load and fails(self.load):
            return Expected.FAIL_LOAD
        if (self.load and not patched and s.backend == Backend.TE
                and behaviour.drops_expert_amax_on_reload
                and s.size.num_experts // self.load.ep > 1):
            return Expected.AMAX_LOST
        return Expected.PASS

    @property
    def world(self) -> int:
        if self.golden:  # no save stage runs
            return self.load.world_size
        return max(self.save.world_size, self.load.world_size if self.load else 0)


# --- goldens: verified against their manifest before anything reads them in place -------------

@functools.lru_cache(maxsize=None)
def _verified(golden_dir: Path) -> tuple[dict | None, str]:
    """(manifest, "") or (None, problem); hashing every file is done once per process and path."""
    try:
        return verify_manifest(golden_dir), ""
    except Exception as exc:  # noqa: BLE001 - GoldenError, or a manifest of the wrong shape
        if isinstance(exc, GoldenError):
            return None, str(exc)
        return None, f"manifest.json unreadable ({type(exc).__name__}: {exc})"


def golden_manifest(name: str, golden_dir: Path = GOLDEN_DIR) -> dict:
    """The golden's manifest, after every file was checked against it (ScenarioError if not)."""
    d = Path(golden_dir) / name
    if not (d / "manifest.json").is_file():
        raise ScenarioError(f"golden {name!r} not found under {golden_dir} (no manifest.json)")
    doc, problem = _verified(d.resolve())
    if problem:
        raise ScenarioError(f"golden {name!r}: {problem.removeprefix(f'{name}: ')}")
    return doc


def golden_topology(name: str, golden_dir: Path = GOLDEN_DIR) -> Topology:
    text = golden_manifest(name, golden_dir).get("topology")
    try:
        return Topology.parse(text if isinstance(text, str) else repr(text))
    except TopologyError as exc:
        raise ScenarioError(f"golden {name!r}: manifest.json topology: {exc}") from None


@functools.lru_cache(maxsize=None)
def golden_layout(name: str, golden_dir: Path = GOLDEN_DIR) -> str:
    """complete | shared | incomplete, from the golden's metadata (python -m harness inspect).

    Unpatched 0.47.0 cannot restore a shared (<= 0.46) or incomplete checkpoint: those cells
    expect ``not-restored`` (the load raises, or the loaded state differs from the checkpoint).
    Read only after the manifest verified, so damaged bytes are named, not unpickled.
    """
    golden_manifest(name, golden_dir)
    from harness.golden.inspect import inspect_checkpoint

    try:
        lay = inspect_checkpoint(Path(golden_dir) / name / "ckpt")
    except Exception as exc:  # noqa: BLE001 - whatever the reader raises, one line for this golden
        raise ScenarioError(f"golden {name!r}: checkpoint metadata unreadable "
                            f"({type(exc).__name__}: {exc})") from None
    return golden_layout_of(lay) or GoldenLayout.INCOMPLETE


# --- the schema: what a scenario file may say ------------------------------------------------

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # scenario and golden names end up in ids and paths
MARKER_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
_NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit"

Name = Annotated[str, Field(pattern=NAME_RE)]
Text = Annotated[str, Field(min_length=1)]


class _Schema(BaseModel):
    # strict: TOML gives real types, so "300" for a number or "tp1" for a list is a mistake
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _KnownGapSchema(_Schema):
    pattern: Text
    reason: Text


_SizeSchema = create_model(  # [model]: any ModelSize field, each a positive integer
    "_SizeSchema", __base__=_Schema,
    **{f.name: (Optional[Annotated[int, Field(gt=0)]], None) for f in dataclasses.fields(ModelSize)})


class _ScenarioSchema(_Schema):
    name: Optional[Name] = None
    description: str = ""
    tier: Literal[TIERS]
    backend: Literal[BACKENDS]
    patch: Literal[PATCHES] = "none"
    expect: Literal[EXPECT_MODES] = ExpectMode.ORACLE.value
    markers: list[Annotated[str, Field(pattern=MARKER_RE)]] = []
    saves: list[str] = []
    loads: list[str] = []
    pairs: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = []
    goldens: list[Name] = []
    singleton_local_shards: bool = True
    strict_load: bool = True
    logits_reference: Literal[LOGITS_REFERENCES] = "save-topology"
    known_gaps: list[_KnownGapSchema] = []
    stage_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    model: Optional[_SizeSchema] = None


_CHOICES = {"tier": TIERS, "backend": BACKENDS, "patch": PATCHES, "expect": EXPECT_MODES,
            "logits_reference": LOGITS_REFERENCES}
_TOML_TYPE = {str: "string", bool: "boolean", int: "integer", float: "float", list: "array",
              dict: "table"}
_WANTED = {"string_type": "a string", "bool_type": "true or false", "int_type": "an integer",
           "float_type": "a number", "list_type": "an array", "dict_type": "a table",
           "model_type": "a table"}


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _keys_at(loc: tuple, top: type[BaseModel]) -> list[str]:
    """The keys allowed in the table at ``loc`` (for 'did you mean')."""
    schema = {"known_gaps": _KnownGapSchema, "model": _SizeSchema}.get(loc[0]) if loc else None
    return list((schema or top).model_fields)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(err: dict, top: type[BaseModel] = _ScenarioSchema) -> str:
    """One pydantic error -> ``key: constraint`` in the words of a TOML file."""
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    where, ctx = _loc(loc), err.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _keys_at(loc[:-1], top)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{where}: unknown key ({hint}allowed: {', '.join(allowed)})"
    if kind == "missing":
        return f"{where}: required key missing"
    if kind == "literal_error":
        choices = _CHOICES.get(loc[-1])
        allowed = ", ".join(choices) if choices else ctx.get("expected", "")
        return f"{where}: {_shown(value)} is not one of {allowed}"
    if kind in _WANTED:
        got = _TOML_TYPE.get(type(value), type(value).__name__)
        return f"{where}: expected {_WANTED[kind]}, got {got} {_shown(value)}"
    if kind == "string_pattern_mismatch":
        rule = _NAME_RULE if ctx.get("pattern") == NAME_RE else f"a name matching {ctx.get('pattern')}"
        return f"{where}: {_shown(value)} must be {rule}"
    if kind == "string_too_short":
        return f"{where}: must not be empty"
    if kind == "greater_than":
        return f"{where}: must be > {ctx.get('gt')}, got {_shown(value)}"
    if kind == "finite_number":
        return f"{where}: must be a finite number, got {_shown(value)}"
    if kind in ("too_short", "too_long") and loc[0] == "pairs":
        return f"{where}: expected [save, load], got {_shown(value)}"
    return f"{where}: {err.get('msg', kind)} (got {_shown(value)})"


# --- loading ------------------------------------------------------------------------------------

def shown_path(path: Path) -> str:
    """The file as a reader finds it: relative to the repository when inside it."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _topologies(raw: list[str], size: ModelSize, key: str, problems: list[str],
                unique: bool = True) -> tuple[Topology, ...]:
    out, seen = [], {}
    for i, text in enumerate(raw):
        try:
            topo = Topology.parse(text).check(size)
        except TopologyError as exc:
            problems.append(f"{key}[{i}]: {exc}")
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
    topos = {k: _topologies(getattr(doc, k), size, k, problems) for k in ("saves", "loads")}
    pairs = []
    for i, pair in enumerate(doc.pairs):
        got = _topologies(pair, size, f"pairs[{i}]", problems, unique=False)
        if len(got) == 2:
            pairs.append(got)
    topos["pairs"] = tuple(pairs)
    if not on_cuda(doc.tier):  # the save calibrates through megatron-core's pipeline schedule
        saved = [(f"saves[{i}]", t) for i, t in enumerate(topos["saves"])]
        saved += [(f"pairs[{i}][0]", p[0]) for i, p in enumerate(pairs)]
        problems += [f"{key}: {t.id}: a save at pp > 1 calibrates through megatron-core's pipeline "
                     "schedule, which allocates its receive buffers on CUDA: tiers gpu-shared "
                     "and gpu only"
                     for key, t in saved if t.pp > 1]
    if problems:
        raise _Problems("; ".join(problems))
    return size, topos


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
        logits_reference=doc.logits_reference,
        known_gaps=tuple(KnownGap(g.pattern, g.reason) for g in doc.known_gaps),
        stage_timeout_s=float(doc.stage_timeout_s),
        markers=tuple(doc.markers),
        source=str(path),
        goldens=tuple(doc.goldens),
        golden_root=Path(golden_dir),
    )


# Data files kept beside the scenarios that are not scenarios (harness/report/verdict.py and
# harness/scenario/selections.py read them).
NOT_SCENARIOS = (QUARANTINE_FILE.name, SELECTIONS_FILE.name)


def load_all_with_errors(directory: Path = SCENARIO_DIR, golden_dir: Path = GOLDEN_DIR
                         ) -> tuple[list[Scenario], list[ScenarioError]]:
    """Every good scenario, and one ScenarioError per bad file: a bad file never hides the others.

    Names are unique across files: of two files with one name, the later (sorted) one is bad.
    """
    good: list[Scenario] = []
    bad: list[ScenarioError] = []
    first: dict[str, Path] = {}
    for p in sorted(Path(directory).glob("*.toml")):
        if p.name in NOT_SCENARIOS:
            continue
        try:
            s = load_scenario(p, golden_dir)
        except ScenarioError as exc:
            bad.append(exc)
            continue
        if s.name in first:
            bad.append(ScenarioError(f"{shown_path(p)}: name: {s.name!r} is already used by "
                                     f"{shown_path(first[s.name])}", p, s.name))
            continue
        first[s.name] = p
        good.append(s)
    return good, bad


_REPORTED: set[str] = set()


def report_errors(errors: list[ScenarioError], stream=None) -> None:
    """Print each bad file's line once per process (load_all runs many times in one command)."""
    for exc in errors:
        if str(exc) not in _REPORTED:
            _REPORTED.add(str(exc))
            print(f"scenario file skipped: {exc}", file=stream or sys.stderr)


def load_all(directory: Path = SCENARIO_DIR, golden_dir: Path = GOLDEN_DIR) -> list[Scenario]:
    """The good scenarios; each bad file's line goes to stderr (load_all_with_errors returns them)."""
    good, bad = load_all_with_errors(directory, golden_dir)
    report_errors(bad)
    return good
