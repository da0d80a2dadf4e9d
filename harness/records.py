"""The typed records that cross file boundaries: a stage's result, a cell's record, outcomes.

A stage result is built once (from a torchrun by harness/launch/torchrun.py, or from a golden
checkpoint by harness/run/cell.py), written as ``stage.json``, read back as the same type and
judged by harness/check/judge.py. A cell record is one entry of results.json
(schema in docs/records.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, Mapping

from harness.tiers import Backend


class Outcome(StrEnum):
    """What a cell came to (harness/check/judge.py decides it)."""

    PASS = "pass"
    BUG_REPRODUCED = "bug-reproduced"  # the bug the pair's rule predicts, where it predicts it
    UNEXPECTED_FAILURE = "unexpected-failure"
    UNEXPECTED_PASS = "unexpected-pass"  # the predicted bug no longer reproduces
    BLOCKED = "blocked"  # its save failed as expected: the load was not run
    SKIPPED = "skipped"
    # The controller was stopped (Ctrl-C, CI cancel) while the cell ran or before it started: says
    # nothing about the product; the run's results.json is then marked incomplete.
    INTERRUPTED = "interrupted"
    # The (nvidia-modelopt, megatron-core) pair has no rule (harness/check/versions.py): what ran is
    # recorded, nothing was predicted, so it is neither good nor unexpected.
    RULE_UNKNOWN = "rule-unknown"
    # A refusal the rule predicts that is NOT the collision (docs/findings.md, "Static NVFP4
    # amax at another expert TP"): a limitation of the product, confirmed where predicted.
    KNOWN_REFUSAL = "known-refusal"
    # ModelOpt refuses to quantize this model with this recipe (its exception, raised from its own
    # code inside mtq.quantize, in the record): nothing about checkpoints can be learnt from it.
    NOT_QUANTIZABLE = "not-quantizable"


class Expected(StrEnum):
    """What a cell is expected to do under the rule of its pair (harness/scenario/cells.py)."""

    PASS = "pass"
    FAIL_SAVE = "fail-save"  # the save's validation collides
    FAIL_LOAD = "fail-load"  # the load's validation collides
    AMAX_LOST = "amax-lost"  # the second bug: per-expert amax gone after load_state_dict
    NOT_RESTORED = "not-restored"  # an unpatched golden this release cannot restore
    RULE_UNKNOWN = "rule-unknown"  # the pair has no rule: nothing is predicted
    # a static per-block amax loaded at another expert TP: megatron-core refuses its global shape
    RESHARD_REFUSED = "reshard-refused"


class ExpectMode(StrEnum):
    """A scenario's ``expect``: how its cells get their expectation."""

    PASS = "pass"  # every cell is expected to pass
    ORACLE = "oracle"  # the pair's rule decides per cell


class Stage(StrEnum):
    """A step of a cell as spec files and records name it (StageSpec.stage, StageResult.stage,
    CellRecord.failed_stage) and rank 0 times it (``<stage>.<phase>`` durations)."""

    SAVE = "save"
    LOAD = "load"
    GOLDEN = "golden"  # a committed checkpoint stands in for the save (harness/run/cell.py)
    VERIFY = "verify"  # the load's comparison of state and logits with the saved reference
    DUMP_METADATA = "dump-metadata"  # a topology's sharded-state-dict metadata, recorded


class Patch(StrEnum):
    """Whether a cell's ranks apply harness.fix before saving and loading."""

    NONE = "none"
    FIX = "fix"


# The stage environment's entries (harness/rank/setup.py record_environment) naming the version of
# harness.fix (moe_ckpt_fix) its ranks applied and the parts it installed (applied_parts), as
# CellRecord.fix_parts keeps them.
FIX_ENV_KEY, FIX_PARTS_ENV_KEY = "moe-ckpt-fix", "moe-ckpt-fix-parts"


class CauseKind(StrEnum):
    """How a stage's first failure showed (harness/launch/failures.py)."""

    EXCEPTION = "exception"
    SIGNAL = "signal"
    EXIT = "exit"
    TIMEOUT = "timeout"
    HANG = "hang"
    # The stage ended without an error, but not every rank of its world reported a result for it
    # (harness/launch/torchrun.py): nothing shows the stage ran, so it did not pass.
    NO_RESULT = "no-result"
    # The save stage reported success, but its checkpoint is not there, not readable, or lacks
    # keys its ranks said they wrote (harness/run/saved.py).
    UNVERIFIED_SAVE = "unverified-save"


EXPECT_MODES = tuple(m.value for m in ExpectMode)
PATCHES = tuple(p.value for p in Patch)
OUTCOMES = tuple(Outcome)
# The harness saw what it expected.
GOOD_OUTCOMES = (Outcome.PASS, Outcome.BUG_REPRODUCED)
# The run fails: the world differs from what the installed ModelOpt's rules predict.
UNEXPECTED_OUTCOMES = (Outcome.UNEXPECTED_FAILURE, Outcome.UNEXPECTED_PASS)


@dataclass
class StageCause:
    """The first failure of a stage (harness/launch/failures.py decides which one is first)."""

    rank: int | None
    kind: str  # a CauseKind
    exc_type: str | None
    message: str
    key: str | None  # the checkpoint key named in the error, if any


@dataclass
class StageResult:
    stage: str  # save | load | golden | dump-metadata
    ok: bool
    wall_s: float
    timed_out: bool = False
    teardown_s: float | None = None  # first failure seen -> every rank gone
    leftovers: list[int] = field(default_factory=list)
    cause: StageCause | None = None
    secondaries: list[str] = field(default_factory=list)  # one line each, labelled secondary
    rank_results: dict[str, dict] = field(default_factory=dict)  # rank (as text) -> its figures
    summary: str = ""
    environment: dict = field(default_factory=dict)  # versions the ranks imported
    interrupted: str | None = None  # the signal that stopped the controller during this stage
    started_at: float | None = None  # epoch: the controller started the stage's torchrun / job
    # A save (or a golden): the quantizer amax keys its checkpoint holds, per module family, those
    # of MTP layers apart (harness/check/keys.py amax_key_counts); None: not read.
    amax_keys: dict | None = None

    @property
    def rank0(self) -> dict:
        return self.rank_results.get("0", {})

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "StageResult":
        cause = doc.get("cause")
        return cls(**{**doc, "cause": StageCause(**cause) if cause else None})


@dataclass
class CellRecord:
    scenario: str
    cell_id: str
    tier: str
    backend: str
    save_topology: str
    load_topology: str | None
    patch: str
    expected: str
    outcome: str = Outcome.SKIPPED
    failed_stage: str | None = None
    exception_type: str | None = None
    message: str | None = None
    failing_key: str | None = None
    first_failure_rank: int | None = None
    secondary_errors: list[str] = field(default_factory=list)
    durations: dict = field(default_factory=dict)
    # Per stage: peak host RSS and GPU memory, the largest rank and the sum over ranks (MiB).
    memory: dict = field(default_factory=dict)
    verify: dict = field(default_factory=dict)
    reason: str | None = None
    teardown_s: float | None = None
    # The nvidia-modelopt the ranks imported, and whose expectations judged the cell
    # (harness/check/versions.py); notice: set when that version is unknown to the harness.
    modelopt: str | None = None
    mcore: str | None = None  # the megatron-core they imported: the rule is the pair's
    expectations: str | None = None
    notice: str | None = None
    # How its stages started: "pool" (warm rank pools) or "fresh" (a torchrun per stage).
    stage_mode: str | None = None
    # A finding about the product that is not the checkpoint's (harness/check/logits.py
    # topology_finding: the forward differs across topologies beyond its noise floor).
    finding: str | None = None
    # The quantization recipe (harness/model/recipes.py); None: recorded before the recipe
    # axis, when every run used the default (``recipe_ref``), and not written then, so such a
    # record re-judges to the same bytes.
    recipe: str | None = None
    # The amax kinds its save's calibration made, per module family (harness/model/quant.py):
    # what the cell is judged by once its save ran.
    amax_kinds: dict | None = None
    # Where those differ from the recipe's forecast (harness/check/recipes.py), one line; the
    # cell is judged by what the save recorded all the same. None: they agree, or no forecast.
    forecast_disagreement: str | None = None
    # Tier gpu with NCCL ranks sharing GPUs (a scenario's shared_gpu_nccl): how it ran, in words.
    nccl_mode: str | None = None
    # Whether a stage of the cell ran past its limit (StageResult.timed_out, noted by
    # harness/run/cell.py). None: recorded before the field, whose reason then said so
    # (harness/check/rejudge.py reads both).
    timed_out: bool | None = None
    # What the ranks of each stage reported about where they ran, per stage (save, load): rank
    # count, topologies, whether megatron-core's validation ran, the expert weight amax keys
    # saved (harness/check/judge.py stage_evidence). An ``unexpected-pass`` needs it. None:
    # recorded before the field.
    evidence: dict | None = None
    # What model ran: its kind, sizes and the modules that are on (harness/model/gpt.py
    # ModelSize.record), and the quantizer amax keys its checkpoint holds per module family (MTP
    # layers' apart). None: recorded before the fields (the verdict names such evidence).
    model: dict | None = None
    amax_keys: dict | None = None
    # The parts of harness.fix its ranks installed, as they recorded them (FIX_PARTS_ENV_KEY):
    # part (f) ("static-block") is opt-in, and only a record naming it is judged by the fixed
    # static rule (harness/check/versions.py kind_rule). None: unpatched, no stage reported, or
    # recorded before the field (judged as without part f, as then).
    fix_parts: list[str] | None = None

    @property
    def recipe_ref(self) -> str:
        from harness.model.recipes import DEFAULT_RECIPE

        return self.recipe or DEFAULT_RECIPE

    def as_dict(self) -> dict:
        out = asdict(self)
        for late in ("recipe", "amax_kinds", "nccl_mode", "timed_out", "evidence", "forecast_disagreement",
                     "model", "amax_keys", "fix_parts"):  # fields younger than most committed runs
            if out[late] is None:
                del out[late]
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], **defaults) -> "CellRecord":
        """A results.json cell of any age, THE reader of recorded cells: a field it lacks takes
        ``defaults`` (e.g. the run's tier), else its default; a field no longer written is
        dropped. Reports, the verdict, the matrix and equivalence read cells through it."""
        known = {f.name for f in fields(cls)}
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
# value the checkpoint holds for another expert of the same layer and linear (issue 38 item 6:
# a load that raises nothing, e.g. strictness log_all, must still name these).
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

    topology: str
    rule: str  # ProbeRule
    world: int
    outcome: str
    exception_type: str | None = None
    failing_key: str | None = None  # the first key the error names
    failing_keys: int = 0  # how many keys it names
    main_replicas: int | None = None  # of the first key, as the error counts them
    message: str | None = None  # the error's start

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ProbeRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


@dataclass
class RunResults:
    """One results.json (docs/records.md), read through ``from_json``; its cells are
    CellRecords (a cell lacking a tier takes the run's), its probes ProbeRecords (cpu repro)."""

    run_id: str = "?"
    created: str = "unknown"
    versions: dict = field(default_factory=dict)
    tier: str | None = None
    cells: list[CellRecord] = field(default_factory=list)
    incomplete: bool = False
    interrupted_by: str | None = None
    probes: list[ProbeRecord] = field(default_factory=list)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "RunResults":
        known = {f.name for f in fields(cls)} - {"cells", "probes"}
        given = {k: v for k, v in doc.items() if k in known and v is not None}
        run = cls(**given)
        run.versions = dict(run.versions or {})
        run.incomplete = doc.get("incomplete") is True
        run.cells = [CellRecord.of(c, tier=doc.get("tier")) for c in doc.get("cells") or []]
        run.probes = [ProbeRecord.from_json(p) for p in doc.get("probes") or []]
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
