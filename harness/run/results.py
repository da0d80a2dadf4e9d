"""results.json: one record per cell (harness/records.py), the same in every tier and entry point."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from harness.jsonfile import write_json_atomic
from harness.paths import RESULTS_DIR
from harness.records import UNEXPECTED_OUTCOMES, CellRecord


def write_record(record: CellRecord, path: Path) -> None:
    write_json_atomic(path, record.as_dict(), indent=2)


def collect(run_dir: Path, versions: dict, tier: str | None = None,
            interrupted: str | None = None) -> dict:
    """Aggregate every cell's record.json under ``run_dir`` into results.json; a run stopped by
    ``interrupted`` (a signal name) is marked incomplete."""
    cells = [json.loads(p.read_text()) for p in sorted(run_dir.glob("cells/*/record.json"))]
    doc = {
        "run_id": run_dir.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions,
        "tier": tier or ",".join(sorted({c["tier"] for c in cells})),
        "cells": cells,
    }
    if interrupted:
        doc.update(incomplete=True, interrupted_by=interrupted)
    write_json_atomic(run_dir / "results.json", doc, indent=2)
    return doc


def new_run_dir(root: Path = RESULTS_DIR, label: str = "run") -> Path:
    """A fresh directory no other run in this checkout can get: runs started in the same second
    (or by two processes at once) get ``-2``, ``-3``, ... (mkdir is atomic)."""
    root.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
    for n in range(1, 10_000):
        run = root / (stem if n == 1 else f"{stem}-{n}")
        try:
            run.mkdir()
            return run
        except FileExistsError:
            continue
    raise RuntimeError(f"{root}: no free run directory for {stem}")


def exit_code(doc: dict) -> int:
    """128 + signal for an interrupted run (as a shell reports it), 1 when any cell is
    unexpected, else 0."""
    if doc.get("incomplete"):
        sig = getattr(signal, doc.get("interrupted_by") or "", signal.SIGINT)
        return 128 + int(sig)
    return 1 if any(c["outcome"] in UNEXPECTED_OUTCOMES for c in doc["cells"]) else 0
