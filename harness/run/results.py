"""results.json: one record per cell (harness/records.py), the same in every tier and entry point."""
from __future__ import annotations

import json
import time
from pathlib import Path

from harness.jsonfile import write_json_atomic
from harness.paths import RESULTS_DIR
from harness.records import CellRecord


def write_record(record: CellRecord, path: Path) -> None:
    write_json_atomic(path, record.as_dict(), indent=2)


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
    write_json_atomic(run_dir / "results.json", doc, indent=2)
    return doc


def new_run_dir(root: Path = RESULTS_DIR, label: str = "run") -> Path:
    run = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
    run.mkdir(parents=True, exist_ok=True)
    return run
