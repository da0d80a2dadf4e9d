"""The typed records that cross file boundaries: a stage's result, a cell's record, outcomes.

A stage result is built once (from a torchrun by harness/launch/torchrun.py, or from a golden
checkpoint by harness/run/cell.py), written as ``stage.json``, read back as the same type and
judged by harness/check/judge.py. A cell record is one entry of results.json. Each record
type validates what is written and read (``check_record``: one line naming the file and the
field); its fields' meanings, written once in ``described``, give docs/records.md's tables and
docs/records.schema.json (harness/report/records_doc.py).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from functools import cache
from typing import Any, Mapping, get_type_hints

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from harness.tiers import Backend
# The record's words (harness/outcomes.py), taken from here by every module.
from harness.outcomes import (EXPECT_MODES, FIX_ENV_KEY, FIX_PARTS_ENV_KEY, GOOD_OUTCOMES,  # noqa: F401
                              OUTCOMES, PATCHES,
                              UNEXPECTED_OUTCOMES, CauseKind, Expected, ExpectMode, Outcome,
                              Patch, Stage)


class RecordError(ValueError):
    """One line: the file, the field and the constraint it breaks, not a traceback in the judge."""


def described(meaning: str, **kw) -> Any:
    """A record field and its one-line meaning: the one place the meaning is written; the JSON
    Schema and docs/records.md's field tables show it (harness/report/records_doc.py)."""
    return field(metadata={"description": meaning}, **kw)


@cache
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


@cache
def _given_type(cls: type) -> Any:
    """``cls``'s fields, each optional: what a record of any age may hold (a field it lacks takes
    its default on read)."""
    return TypedDict(f"{cls.__name__}Given", get_type_hints(cls), total=False)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _item(name: str, i: int, doc: Any) -> str:
    """``cells[3] (cell_id)``: an entry of a list as an error names it."""
    label = doc.get("cell_id") if isinstance(doc, Mapping) else None
    return f"{name}[{i}]" + (f" ({label})" if label else "")


def check_record(tp: Any, doc: Any, source: str) -> Any:
    """``doc`` if it is a ``tp`` as JSON holds it (types strict: no "1" for 1), else RecordError
    in one line naming ``source``, the field and the constraint (the first of them)."""
    try:
        _adapter(tp).validate_json(json.dumps(doc, default=str), strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RecordError(f"{source}: {where or 'the record'}: {err['msg']}, got "
                          f"{_shown(err.get('input'))}{more}") from None
    return doc


def check_given(cls: type, given: Mapping[str, Any], source: str) -> None:
    """The fields ``given`` of a ``cls`` record read back, each of its type (read side)."""
    check_record(_given_type(cls), dict(given), source)


@dataclass
class StageCause:
    """The first failure of a stage (harness/launch/failures.py decides which one is first)."""

    rank: int | None = described("the rank that failed first; null: none known (a timeout, a hang)")
    kind: CauseKind = described("how the failure showed")
    exc_type: str | None = described("the exception's type, if it raised")
    message: str = described("the error's message, or what was seen instead")
    key: str | None = described("the checkpoint key named in the error, if any")


@dataclass
class StageResult:
    """A stage's result: ``stage.json`` of a save (reused by every cell of that save), judged by
    harness/check/judge.py."""

    stage: Stage = described("which stage")
    ok: bool = described("every rank reported success")
    wall_s: float = described("seconds from the stage's start to its last rank's exit")
    timed_out: bool = described("the stage ran past its limit", default=False)
    teardown_s: float | None = described("seconds from the first failure seen to every rank gone",
                                         default=None)
    leftovers: list[int] = described("pids still alive after the teardown", default_factory=list)
    cause: StageCause | None = described("the first failure; null: none", default=None)
    secondaries: list[str] = described("the other ranks' errors, one line each, labelled secondary",
                                       default_factory=list)
    rank_results: dict[str, dict] = described("rank (as text) -> the figures it reported",
                                              default_factory=dict)
    summary: str = described("the stage in one line", default="")
    environment: dict = described("the versions the ranks imported", default_factory=dict)
    interrupted: str | None = described("the signal that stopped the controller during this stage",
                                        default=None)
    started_at: float | None = described("epoch seconds: the controller started the stage's torchrun "
                                         "or job", default=None)
    amax_keys: dict | None = described(
        "a save (or a golden): the quantizer amax keys its checkpoint holds per module family, MTP "
        "layers' apart (harness/check/keys.py amax_key_counts); null: not read", default=None)
    amax_kinds: dict | None = described(
        "a save: the amax kinds per module family its ranks' calibration made, recorded before the "
        "save (so a failed save has them too), merged over the ranks; null: no rank got there",
        default=None)

    @property
    def rank0(self) -> dict:
        return self.rank_results.get("0", {})

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict, *, source: str = "stage.json") -> "StageResult":
        check_given(cls, doc, source)
        cause = doc.get("cause")
        return cls(**{**doc, "cause": StageCause(**cause) if cause else None})


@dataclass
class CellRecord:
    """One cell's record: ``record.json``, and one entry of results.json's ``cells``."""

    scenario: str = described("the scenario the cell belongs to")
    cell_id: str = described("the cell's id, unique in its run")
    tier: str = described("`cpu`, `gpu` or `gpu-shared` (harness/tiers.py)")
    backend: str = described("`te`, `local` or `gloo` (harness/tiers.py)")
    save_topology: str = described("the topology that saved")
    load_topology: str | None = described("the topology that loaded; null: a save-only cell")
    patch: str = described("`none` or `fix`: whether its ranks applied harness.fix")
    expected: Expected = described("what the pair's rule predicts (harness/check/expectation.py)")
    outcome: Outcome = described("what the cell came to (harness/check/judge.py)",
                                 default=Outcome.SKIPPED)
    failed_stage: Stage | None = described("the stage that failed first; null: none", default=None)
    exception_type: str | None = described("the first failure's exception type", default=None)
    message: str | None = described("the first failure's message", default=None)
    failing_key: str | None = described("the checkpoint key the error names", default=None)
    first_failure_rank: int | None = described("the rank that failed first", default=None)
    secondary_errors: list[str] = described("the other ranks' errors, `rank N: <type>: <first line>`",
                                            default_factory=list)
    durations: dict = described(
        "seconds: save_stage, load_stage, and rank 0's phases as `<stage>.<phase>` (start, imports, "
        "build, quantize, save, load, verify, exit; start and exit from the stage's start and the "
        "epochs rank 0 writes, so the phases add up to the stage)", default_factory=dict)
    memory: dict = described("per stage: peak host RSS and GPU memory, the largest rank and the sum "
                             "over ranks (MiB)", default_factory=dict)
    verify: dict = described(
        "the load's verify figures (keys_compared, expert_amax_compared, mismatches, missing_keys, "
        "logits_*, routing_*, noise_floor_figures, ...) and what was judged of them "
        "(logits_rel_diff, logits_tolerance, logits_asserted, logits_ok, cross_topology, "
        "load_warnings, ...): read through Verify", default_factory=dict)
    reason: str | None = described("why it was blocked or skipped", default=None)
    teardown_s: float | None = described("seconds from the first failure to every rank gone",
                                         default=None)
    modelopt: str | None = described("the nvidia-modelopt the ranks imported", default=None)
    mcore: str | None = described("the megatron-core they imported: the rule is the pair's",
                                  default=None)
    expectations: str | None = described("whose rules judged the cell (harness/check/versions.py)",
                                         default=None)
    notice: str | None = described("why nothing is predicted: the pair, or the amax kind and module "
                                   "family with no rule", default=None)
    stage_mode: str | None = described("`pool` (warm rank pools), `fresh` (a torchrun per stage) or "
                                       "`fork` (ranks forked from a warm parent by torch's elastic "
                                       "launcher): how its stages started; absent before 2026-12-03 11:00",
                                       default=None)
    finding: str | None = described(
        "a finding about the product that is not the checkpoint's: the forward differs across "
        "topologies beyond its noise floor (harness/check/logits.py topology_finding)", default=None)
    recipe: str | None = described(
        "the quantization recipe (harness/model/recipes.py); absent: recorded before the recipe "
        "axis, when every run used the default", default=None)
    amax_kinds: dict | None = described(
        "the amax kinds its save's calibration made, per module family (harness/model/quant.py): "
        "what the cell is judged by once its save ran", default=None)
    forecast_disagreement: str | None = described(
        "where those differ from the recipe's forecast (harness/check/recipes.py), one line; "
        "absent: they agree, or no forecast", default=None)
    nccl_mode: str | None = described("tier gpu with NCCL ranks sharing GPUs: how it ran, in words",
                                      default=None)
    timed_out: bool | None = described(
        "a stage ran past its limit; absent before 2026-12-06, when only the reason said so "
        "(harness/check/rejudge.py reads both)", default=None)
    evidence: dict | None = described(
        "per stage, what its ranks reported about where they ran: ranks, topologies, validated, a "
        "save's expert_weight_amax_keys (harness/check/judge.py stage_evidence); an "
        "`unexpected-pass` needs it; absent before the field", default=None)
    model: dict | None = described(
        "what model ran: its kind, sizes, the modules that are on and its "
        "position_embedding_type (ModelSize.record; a record before that key built its kind's "
        "own: learned_absolute for gpt, none for hybrid); the verdict refuses another model's "
        "evidence and names records made before the field",
        default=None)
    amax_keys: dict | None = described(
        "the quantizer amax keys its checkpoint holds per module family, MTP layers' apart under "
        "`mtp` (also in the save's stage.json); absent before the field", default=None)
    fix_parts: list[str] | None = described(
        "the parts of harness.fix its ranks installed, as they recorded them (FIX_PARTS_ENV_KEY): "
        "part (f) (`static-block`) is opt-in, and only a record naming it is judged by the fixed "
        "static rule (harness/check/versions.py kind_rule); absent: unpatched, no stage reported, "
        "or recorded before the field (judged as without part f)", default=None)
    raw_versions: dict[str, str] | None = described(
        "distribution -> the version string its ranks imported, where it is not the release that "
        "`modelopt` and `mcore` name (a local `+<sha>`, a `.dev` part: harness/check/release.py); "
        "absent: none differs, or recorded before the field", default=None)

    @property
    def recipe_ref(self) -> str:
        from harness.model.recipes import DEFAULT_RECIPE

        return self.recipe or DEFAULT_RECIPE

    def as_dict(self) -> dict:
        out = asdict(self)
        for late in ("recipe", "amax_kinds", "nccl_mode", "timed_out", "evidence", "forecast_disagreement",
                     "model", "amax_keys", "fix_parts", "raw_versions"):  # fields younger than most committed runs
            if out[late] is None:
                del out[late]
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, source: str = "a results.json cell",
                  **defaults) -> "CellRecord":
        """A results.json cell of any age, THE reader of recorded cells: a field it lacks takes
        ``defaults`` (e.g. the run's tier), else its default; a field no longer written is
        dropped. Reports, the verdict, the matrix and equivalence read cells through it. A field
        of the wrong type: RecordError naming ``source`` and the field."""
        known = {f.name for f in fields(cls)}
        check_given(cls, {k: v for k, v in doc.items() if k in known}, source)
        base = {"scenario": "", "cell_id": "", "tier": "", "backend": Backend.TE, "save_topology": "",
                "load_topology": None, "patch": "", "expected": ""}
        given = {k: v for k, v in doc.items() if k in known}
        rec = cls(**{**base, **defaults, **given})
        rec.durations, rec.memory = dict(rec.durations or {}), dict(rec.memory or {})
        rec.verify, rec.secondary_errors = dict(rec.verify or {}), list(rec.secondary_errors or [])
        return rec

    @classmethod
    def of(cls, rec: "CellRecord | Mapping[str, Any]", **defaults) -> "CellRecord":
        """``rec`` as a CellRecord (a recorded dict is read by ``from_json``)."""
        return rec if isinstance(rec, cls) else cls.from_json(rec, **defaults)

    @property
    def verified(self) -> "Verify":
        return Verify.from_json(self.verify)


# What a per-expert weight-quantizer amax holds after a load, worst first: a zero placeholder
# (modelopt >= 0.48 registers one for every expert before loading), another value, or the
# checkpoint's value. ``absent``: no rank's model has the buffer at all. The load ranks count
# them (harness/rank/compare.py), the judge names them (harness/check/judge.py).
# ``non-finite``: inf or nan where the checkpoint has a number; ``another-expert``: exactly the
# value the checkpoint holds for another expert of the same layer and linear (a load that raises nothing, e.g. strictness log_all, must still name these).
AMAX_STATES = ("absent", "placeholder-zero", "non-finite", "another-expert", "differs", "restored")
# Those the judge names as a problem of their own, even when the load raised nothing.
NAMED_AMAX_STATES = ("placeholder-zero", "non-finite", "another-expert")


@dataclass(frozen=True)
class Verify:
    """A load's verify figures (rank 0's measurements, judged: docs/records.md), typed where
    the read side uses them; ``figures`` keeps every figure as recorded."""

    figures: dict = field(default_factory=dict)
    mismatch_count: int = 0
    mismatches: Any = ()  # the first differing tensors (a count in records before 2026-12)
    missing_keys: Any = ()
    unexpected_keys: Any = ()
    expert_amax_state: dict = field(default_factory=dict)  # saved, restored, absent, ...
    logits_effect: dict | None = None
    cross_topology: dict = field(default_factory=dict)  # rel_diff, routing_flips, noise_floor, ...
    logits_rel_diff: float | None = None
    logits_asserted: str | None = None
    logits_ok: bool | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> "Verify":
        doc = dict(doc or {})
        typed = {f.name: doc[f.name] for f in fields(cls) if f.name != "figures" and doc.get(f.name) is not None}
        return cls(figures=doc, **typed)

    def __bool__(self) -> bool:
        return bool(self.figures)


class ProbeRule(StrEnum):
    """How a validation probe builds the per-expert amax (harness/rank/validation_probes.py)."""

    BUGGY = "buggy"  # as nvidia-modelopt 0.47.0 does: the dense TP rank in the replica id
    FIXED = "fixed"  # as the fix (and 0.48.0rc1) does: the expert TP rank


@dataclass
class ProbeRecord:
    """megatron-core's real ``validate_sharding_integrity`` on per-expert amax built by one rule,
    on gloo ranks and with no model: the cpu tier's witness of the collision, which its cells
    (SequentialMLP, TP = ETP) cannot show. One entry of results.json's ``probes``; judged by
    harness/check/probes.py."""

    topology: str = described("the topology the probe's ranks stand for")
    rule: ProbeRule = described("how the per-expert amax was built: `buggy` (ModelOpt 0.47.0's "
                                "replica ids) or `fixed`")
    world: int = described("its gloo ranks")
    outcome: Outcome = described("as a cell's (harness/check/probes.py)")
    exception_type: str | None = described("the error's type", default=None)
    failing_key: str | None = described("the first key the error names", default=None)
    failing_keys: int = described("how many keys it names", default=0)
    main_replicas: int | None = described("of the first key, as the error counts them", default=None)
    message: str | None = described("the error's start", default=None)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, source: str = "a results.json probe") -> "ProbeRecord":
        known = {f.name for f in fields(cls)}
        given = {k: v for k, v in doc.items() if k in known}
        check_given(cls, given, source)
        return cls(**given)


@dataclass
class RunResults:
    """One results.json (docs/records.md), read through ``from_json``; its cells are
    CellRecords (a cell lacking a tier takes the run's), its probes ProbeRecords (cpu repro)."""

    run_id: str = described("the run's directory name under results/: unique, runs started in the "
                            "same second get `-2`, `-3`, ...", default="?")
    created: str = described("when the run was collected (UTC, ISO 8601)", default="unknown")
    versions: dict = described("distribution -> the version the controller saw (nvidia-modelopt, "
                               "megatron-core, torch, ...)", default_factory=dict)
    tier: str | None = described("the tier(s) its cells ran in, comma-separated", default=None)
    cells: list[CellRecord] = described("every cell's record", default_factory=list)
    incomplete: bool = described("the controller was stopped before every cell finished (written "
                                 "only then)", default=False)
    interrupted_by: str | None = described("`SIGINT` or `SIGTERM`: what stopped it (written only "
                                           "with incomplete)", default=None)
    probes: list[ProbeRecord] = described(
        "a cpu `repro` run's validation probes: megatron-core's real validate_sharding_integrity "
        "on per-expert amax built by one rule, on gloo ranks, no model (written only when there "
        "are some)", default_factory=list)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, source: str = "results.json") -> "RunResults":
        known = {f.name for f in fields(cls)} - {"cells", "probes"}
        given = {k: v for k, v in doc.items() if k in known and v is not None}
        check_given(cls, given, source)
        run = cls(**given)
        run.versions = dict(run.versions or {})
        run.incomplete = doc.get("incomplete") is True
        run.cells = [CellRecord.of(c, tier=doc.get("tier"), source=f"{source}: {_item('cells', i, c)}")
                     for i, c in enumerate(doc.get("cells") or [])]
        run.probes = [ProbeRecord.from_json(p, source=f"{source}: {_item('probes', i, p)}")
                      for i, p in enumerate(doc.get("probes") or [])]
        return run

    @classmethod
    def of(cls, doc: "RunResults | Mapping[str, Any]") -> "RunResults":
        return doc if isinstance(doc, cls) else cls.from_json(doc)

    def to_json(self) -> dict:
        """results.json as written (harness/run/results.py collect): ``incomplete`` and
        ``interrupted_by`` only on a run that was stopped, ``probes`` only on one that has them."""
        doc = {"run_id": self.run_id, "created": self.created, "versions": self.versions,
               "tier": self.tier, "cells": [c.as_dict() for c in self.cells]}
        if self.probes:
            doc["probes"] = [p.as_dict() for p in self.probes]
        if self.incomplete:
            doc.update(incomplete=True, interrupted_by=self.interrupted_by)
        return doc

    def version(self, dist: str) -> str | None:
        """The version of ``dist`` (``nvidia-modelopt``, ``megatron-core``, ...) the run recorded."""
        return self.versions.get(dist) or None
