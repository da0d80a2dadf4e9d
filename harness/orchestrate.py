"""Controller loops outside pytest: run scenario cells in order, record metadata."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .environment import tier_skip_reason, versions
from .results import CellRecord, collect, new_run_dir, write_record
from .runner import _safe, run_cell


def _skipped(cell, reason: str) -> CellRecord:
    s = cell.scenario
    return CellRecord(
        scenario=s.name, cell_id=cell.id, tier=s.tier, backend=s.backend,
        save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
        patch=s.patch, expected=cell.expected, outcome="skipped", reason=reason,
    )


def run_scenarios(scenarios, results_root: Path, label: str, out=sys.stdout) -> dict:
    """Run every cell (skipping those this machine cannot run), print progress and the table."""
    from .report import markdown_summary, progress_line

    run_dir = new_run_dir(results_root, label)
    cells = [c for s in scenarios for c in s.cells()]
    start, failures = time.monotonic(), 0
    for n, cell in enumerate(cells, 1):
        reason = tier_skip_reason(cell.scenario.tier, cell.world)
        if reason:
            rec = _skipped(cell, reason)
            write_record(rec, run_dir / "cells" / _safe(cell.id) / "record.json")
        else:
            rec = run_cell(cell, run_dir)
        failures += rec.outcome in ("unexpected-failure", "unexpected-pass")
        print(progress_line(n, len(cells), failures, time.monotonic() - start)
              + f"  {cell.id}: {rec.outcome}", file=out, flush=True)
    doc = collect(run_dir, versions())
    print(markdown_summary(doc), file=out)
    print(f"results: {run_dir / 'results.json'}", file=out)
    return doc


def dump_metadata(topo, tier: str, backend: str, patch: str, out: Path, results_root: Path) -> int:
    from .launch import run_stage
    from .model import CPU_SIZE, GPU_SIZE
    from .stage_spec import StageSpec

    reason = tier_skip_reason(tier, topo.world_size)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    size = GPU_SIZE if backend == "te" else CPU_SIZE
    topo.check(size)
    stage_dir = new_run_dir(results_root, f"dump-{topo.id}-{patch}")
    spec = StageSpec("dump-metadata", topo.id, tier, backend, "", "", patch=patch,
                     size=size.as_dict(), output=str(out.resolve()))
    run = run_stage("dump-metadata", stage_dir, topo.world_size,
                    [str(spec.write(stage_dir / "spec.json"))], timeout_s=300)
    print(run.summary())
    return 0 if run.ok else 1
