"""The words a record is written in: outcomes, expectations, stages, patches and what a stage's
first failure was. harness/records.py builds the record types on them (and re-exports them:
every module takes them from there)."""
from __future__ import annotations

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
    # A refusal the rule predicts that is NOT the collision (docs/findings.md, "Static NVFP4
    # amax at another expert TP"; megatron-core's MTP position embedding at pp > 1,
    # harness/check/versions.py MTP_POSITION_EMBEDDING), or a known defect of the product's
    # (ModelOpt's restore dry run on integer expert amax not yet loaded, versions.py
    # RESTORE_DRY_RUN): a limitation of the product, confirmed where predicted.
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
    # MTP at pp > 1 with a learned absolute position embedding: megatron-core refuses the MTP
    # stage's own position embedding, a second main replica (harness/check/versions.py
    # MTP_POSITION_EMBEDDING), at the first stage at pp > 1 (the save, else the load)
    MTP_EMBEDDING_REFUSED = "mtp-embedding-refused"
    # Passes, or dies of ModelOpt's restore dry run (harness/check/versions.py RESTORE_DRY_RUN: a
    # device-side assert on integer expert amax torch.empty made) at the first stage that restores
    # ModelOpt's state (the save's reference reload, else the load); nondeterministic. Where it
    # does not fire, the cell is judged by the expectation behind it.
    RESTORE_DRY_RUN = "restore-dry-run"


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
# What a cell's test passes on: the harness saw what it expected, or the judge confirmed a
# limitation of the product (a predicted refusal; a recipe ModelOpt refuses for this model). The
# run's exit code passes on them too (harness/run/results.py exit_code).
PASSING_OUTCOMES = (*GOOD_OUTCOMES, Outcome.KNOWN_REFUSAL, Outcome.NOT_QUANTIZABLE)
# What says nothing about the product either way: a cell's test skips, naming it and its reason.
UNDECIDED_OUTCOMES = (Outcome.BLOCKED, Outcome.SKIPPED, Outcome.RULE_UNKNOWN)
# The run fails: the world differs from what the installed ModelOpt's rules predict.
UNEXPECTED_OUTCOMES = (Outcome.UNEXPECTED_FAILURE, Outcome.UNEXPECTED_PASS)
