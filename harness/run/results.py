"""results.json: one record per cell, the same in every tier and entry point."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.paths import RESULTS_DIR

OUTCOMES = ("pass", "bug-reproduced", "unexpected-failure", "unexpected-pass", "blocked", "skipped")
# Outcomes that mean the harness saw what it expected.
GOOD_OUTCOMES = ("pass", "bug-reproduced")


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
    outcome: str = "skipped"
    failed_stage: str | None = None
    exception_type: str | None = None
    message: str | None = None
    failing_key: str | None = None
    first_failure_rank: int | None = None
    secondary_errors: list[str] = field(default_factory=list)
    durations: dict = field(default_factory=dict)
    verify: dict = field(default_factory=dict)
    reason: str | None = None
    teardown_s: float | None = None
    # The nvidia-modelopt the ranks imported, and whose expectations judged the cell
    # (harness/check/versions.py); notice: set when that version is unknown to the harness.
    modelopt: str | None = None
    expectations: str | None = None
    notice: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def write_record(record: CellRecord, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.as_dict(), indent=2))
    tmp.replace(path)


def collect(run_dir: Path, versions: dict, tier: str | None = None) -> dict:
    """Aggregate every cell's record.json under ``run_dir`` into results.json."""
    cells = [json.loads(p.read_text()) for p in sorted(run_dir.glob("cells/*/record.json"))]
    doc = {
        "run_id": run_dir.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions,
        "tier": tier or ",".join(sorted({c["tier"] for c in cells})),
        "cells": cells,
    }
    (run_dir / "results.json").write_text(json.dumps(doc, indent=2))
    return doc


def new_run_dir(root: Path = RESULTS_DIR, label: str = "run") -> Path:
    run = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
    run.mkdir(parents=True, exist_ok=True)
    return run
