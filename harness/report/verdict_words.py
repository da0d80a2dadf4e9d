"""A verdict's words (SAFE ... NOT QUANTIZABLE), the roles of its evidence cells and the Verdict
itself: what verdict.py decides and gate.py, verdict_text.py and the evidence page show."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from harness.records import Outcome
from harness.report.jobs import Job

SAFE, SAFE_WITH_PATCH, BLOCKED = "SAFE", "SAFE WITH PATCH", "BLOCKED"
INCOMPLETE, NO_EVIDENCE, UNEXPECTED = "INCOMPLETE", "NO EVIDENCE", "UNEXPECTED FAILURE"
NO_RULE = "RULE UNKNOWN"  # the (modelopt, megatron-core) pair has no rule: nothing to judge by
# ModelOpt refuses to quantize the model with the job's recipe: nothing about checkpoints to judge
NOT_QUANTIZABLE = "NOT QUANTIZABLE"
UNDECIDED = (INCOMPLETE, NO_EVIDENCE)  # summarised once per job, not once per results file
MISSING = "missing"  # an evidence cell no results file holds
NOT_RUN = (MISSING, Outcome.SKIPPED, Outcome.INTERRUPTED)  # evidence that says nothing


class Role(StrEnum):
    """What an evidence cell stands for in a job's verdict."""

    WITNESS = "witness"  # the unpatched scenario: does the bug still reproduce at the shapes?
    FIX = "fix"  # the patched scenario: does harness.fix make the shapes pass?


@dataclass
class Evidence:
    cell_id: str
    role: Role
    outcome: str  # a results.json outcome, or MISSING
    note: str = ""


@dataclass
class Verdict:
    job: Job
    word: str
    detail: str
    tier: str
    evidence: list[Evidence] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # loads the rule refuses (known-refusal)
    # RULE UNKNOWN from the job's own recipe file: the amax kind no rule covers, in one line
    kind_without_rule: str | None = None

    @property
    def unexpected(self) -> bool:
        return self.word == UNEXPECTED

    @property
    def ran(self) -> list[str]:
        """Evidence cells that ran (not missing, skipped or interrupted)."""
        return [e.cell_id for e in self.evidence if e.outcome not in NOT_RUN]
