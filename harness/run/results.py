"""results.json: one record per cell (harness/records.py), the same in every tier and entry point."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from harness.check.release import as_release
from harness.jsonfile import write_json_atomic
from harness.paths import RunDir
from harness.records import UNEXPECTED_OUTCOMES, CellRecord, ProbeRecord, RunResults, check_record


def write_record(record: CellRecord, path: Path) -> None:
    """The one place a cell's record is written: its versions as their releases, the raw
    strings beside them (harness/check/release.py)."""
    record = as_release(record)
    write_json_atomic(path, check_record(CellRecord, record.as_dict(), str(path)), indent=2)


def write_probes(records: list[ProbeRecord], run: RunDir) -> None:
    """A run's judged validation probes, which ``collect`` puts into results.json."""
    write_json_atomic(run.probes, check_record(list[ProbeRecord], [r.as_dict() for r in records],
                                               str(run.probes)), indent=2)


def collect(run_dir: RunDir | Path, versions: dict, tier: str | None = None,
            interrupted: str | None = None) -> dict:
    """Aggregate every cell's record.json (and probes.json, where a probe ran) under ``run_dir``
    into results.json; a run stopped by ``interrupted`` (a signal name) is marked incomplete.
    Returns the document written."""
    run = RunDir.of(run_dir)
    cells = [CellRecord.from_json(json.loads(p.read_text()), source=str(p)) for p in run.records()]
    probes = ([ProbeRecord.from_json(p, source=str(run.probes)) for p in json.loads(run.probes.read_text())]
              if run.probes.is_file() else [])
    results = RunResults(
        run_id=run.run_id, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        versions=versions, tier=tier or ",".join(sorted({c.tier for c in cells})), cells=cells,
        incomplete=bool(interrupted), interrupted_by=interrupted, probes=probes)
    doc = check_record(RunResults, results.to_json(), str(run.results))
    write_json_atomic(run.results, doc, indent=2)
    return doc


def exit_code(doc: dict) -> int:
    """128 + signal for an interrupted run (as a shell reports it), 1 when any cell or probe is
    unexpected, else 0."""
    if doc.get("incomplete"):
        sig = getattr(signal, doc.get("interrupted_by") or "", signal.SIGINT)
        return 128 + int(sig)
    records = [*doc["cells"], *(doc.get("probes") or [])]
    return 1 if any(r["outcome"] in UNEXPECTED_OUTCOMES for r in records) else 0
