"""A cell's facts, fixed when the cell is planned: everything its expectation and its judging read.

Why: a cell used to reach the judge as a duck-typed scenario cell (or, for a recorded cell no
scenario holds any more, as stand-in classes imitating one), and its expectation was worked out
again wherever it was needed. A ``CellPlan`` is built once, from a scenario cell
(harness/scenario/cells.py ``Cell.plan``) or from a recorded cell (``CellPlan.of_record``), and
the expectation rule (harness/check/expectation.py) and the judge (harness/check/judge.py) read
it and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.check.gaps import BACKEND_GAPS, KnownGap
from harness.records import CellRecord, Expected
from harness.tiers import Backend
from harness.topology.topology import Topology


@dataclass(frozen=True)
class CellPlan:
    id: str
    scenario: str
    tier: str
    backend: str
    patch: str
    recipe: str  # a recipe reference (harness/model/recipes.py)
    expect: str  # the scenario's ExpectMode
    save: Topology  # a golden cell: the topology the golden was saved at
    load: Topology | None  # None: a save-only cell
    num_experts: int
    golden: str = ""  # a golden cell: the committed checkpoint standing in for the save
    golden_layout: str | None = None  # its GoldenLayout, read when planned (unpatched goldens)
    golden_ckpt: Path | None = None  # its checkpoint folder (format checks)
    known_gaps: tuple[KnownGap, ...] = ()
    # The module families its model has (harness/model/recipes.py model_families): what a
    # recipe's forecast covers on it. None: not known (a recorded cell no scenario holds now).
    families: tuple[str, ...] | None = None
    # A recorded cell no scenario holds now: its recorded expectation stands (nothing to plan).
    recorded_expected: str | None = None
    # The fix's opt-in parts the scenario asks its ranks to install: what decides before a stage
    # has reported the parts they did install (harness/check/judge.py ran_decision).
    fix_parts: tuple[str, ...] = ()
    # The model's MTP layers and position embedding (harness/model/gpt.py ModelSize): what
    # megatron-core's own refusals read (harness/check/versions.py MODEL_DEFECTS). None: not known
    # (a recorded cell no scenario holds now).
    mtp_num_layers: int | None = None
    position_embedding: str | None = None

    @property
    def world(self) -> int:
        if self.golden:  # no save stage runs
            return self.load.world_size
        return max(self.save.world_size, self.load.world_size if self.load else 0)

    @classmethod
    def of_record(cls, rec: CellRecord) -> "CellPlan":
        """A recorded cell as its own plan: the facts its record keeps."""
        return cls(
            id=rec.cell_id, scenario=rec.scenario, tier=rec.tier, backend=rec.backend or Backend.TE,
            patch=rec.patch, recipe=rec.recipe_ref, expect="", num_experts=0,
            save=Topology.parse(rec.save_topology),
            load=Topology.parse(rec.load_topology) if rec.load_topology else None,
            known_gaps=BACKEND_GAPS.get(rec.backend or Backend.TE, ()),
            recorded_expected=rec.expected or Expected.PASS,
        )
