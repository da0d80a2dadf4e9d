"""The typed records that cross file boundaries: a stage's result, a cell's record, outcomes.

A stage result is built once (from a torchrun by harness/launch/torchrun.py, or from a golden
checkpoint by harness/run/cell.py), written as ``stage.json``, read back as the same type and
judged by harness/check/judge.py. A cell record is one entry of results.json
(schema in docs/ARCHITECTURE.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


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


class Expected(StrEnum):
    """What a cell is expected to do under the rule of its pair (harness/scenario/cells.py)."""

    PASS = "pass"
    FAIL_SAVE = "fail-save"  # the save's validation collides
    FAIL_LOAD = "fail-load"  # the load's validation collides
    AMAX_LOST = "amax-lost"  # the second bug: per-expert amax gone after load_state_dict
    NOT_RESTORED = "not-restored"  # an unpatched golden this release cannot restore
    RULE_UNKNOWN = "rule-unknown"  # the pair has no rule: nothing is predicted


class ExpectMode(StrEnum):
    """A scenario's ``expect``: how its cells get their expectation."""

    PASS = "pass"  # every cell is expected to pass
    ORACLE = "oracle"  # the pair's rule decides per cell


class CauseKind(StrEnum):
    """How a stage's first failure showed (harness/launch/failures.py)."""

    EXCEPTION = "exception"
    SIGNAL = "signal"
    EXIT = "exit"
    TIMEOUT = "timeout"
    HANG = "hang"


EXPECT_MODES = tuple(m.value for m in ExpectMode)
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

    def as_dict(self) -> dict:
        return asdict(self)
