"""Controller loops outside pytest: run scenario cells in order, record metadata."""
from __future__ import annotations

import fnmatch
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.machine import skip_reason, tier_skip_reason, versions
from harness.launch.pool import POOLS, stage_mode
from harness.launch.warm import WARM
from harness.launch.signals import shutdown_signal
from harness.paths import RunDir
from harness.records import UNEXPECTED_OUTCOMES, CellRecord, Outcome, Stage
from harness.run.cell import new_record, run_cell
from harness.run.results import collect, write_record
from harness.tiers import StageMode


def _skipped(cell, reason: str) -> CellRecord:
    rec = new_record(cell)
    rec.outcome, rec.reason = Outcome.SKIPPED, reason
    return rec


def select_cells(scenarios, patterns: list[str] | None = None) -> list:
    """Every cell, or those whose id matches one of the glob ``patterns``."""
    cells = [c for s in scenarios for c in s.cells()]
    if not patterns:
        return cells
    # Cell ids contain brackets: they are literal here, only * and ? are wildcards.
    globs = [p.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]") for p in patterns]
    chosen = [c for c in cells if any(fnmatch.fnmatchcase(c.id, g) for g in globs)]
    # A chosen load needs its save: keep the save-only cell of every save a chosen cell uses.
    needed = {(c.scenario.name, c.save_id) for c in chosen}
    return [c for c in cells if c in chosen
            or (c.load is None and (c.scenario.name, c.save_id) in needed)]


def _phase_order(cells: list, stage: str) -> list:
    """Warm pools (HARNESS_STAGE_MODE=pool) serve one world size, tier and patch each: running a
    phase's stages grouped that way lets each stage find the pool the previous one left idle,
    and the groups that have an idle pool now (left by the save phase) go first, before other
    groups start pools. The fresh mode keeps the scenario's order."""
    if all(stage_mode(c.scenario.tier) != StageMode.POOL for c in cells):
        return cells
    warm = POOLS.idle_shapes()

    def key(c):
        topo = c.save if stage == Stage.SAVE else c.load
        shape = (c.scenario.tier, c.scenario.patch, c.scenario.backend, topo.world_size)
        return (shape not in warm, shape)

    return sorted(cells, key=key)


def prestart_save_pools(cells, run: RunDir) -> int:
    """Pool mode: start now the warm pool each save stage of ``cells`` will take (one per save
    stage; golden cells have none), so their start and imports overlap what the controller
    does before run_cells (make repro: its GPU checks). Returns how many were started."""
    from harness.launch.pool import PoolKey
    from harness.run.cell import rank_env  # the rank environment _launch keys a pool by

    keys = [PoolKey.of(c.save.world_size, c.scenario.tier, c.scenario.patch, c.scenario.backend,
                       run.root, rank_env(c.scenario))
            for c in cells
            if c.load is None and not c.golden and stage_mode(c.scenario.tier) == StageMode.POOL]
    POOLS.prestart(keys)
    return len(keys)


def prestart_warm_parents(cells, run: RunDir) -> int:
    """Fork mode: start now the warm parent each of ``cells`` will fork its ranks from (one per
    key), so its imports overlap what the controller does before run_cells (make repro on the
    cpu tier: the map and the real-validation probe) instead of delaying the first stage.
    Returns how many were started."""
    from harness.launch.warm import parent_key
    from harness.run.cell import rank_env  # the rank environment _launch keys a parent by

    keys = {parent_key(c.scenario.tier, c.scenario.patch, c.scenario.backend, run.root,
                       rank_env(c.scenario))
            for c in cells if not c.golden and stage_mode(c.scenario.tier) == StageMode.FORK}
    for key in keys:
        WARM.get(key)
    return len(keys)


def _warm_extensions(cells, out) -> None:
    """ModelOpt's FP8 extension built once before the cells on CUDA that may need it
    (harness/launch/extensions.py), not by the first such stage inside its timeout."""
    from harness.launch.extensions import may_need_fp8_extension, warm_up
    from harness.tiers import facts

    on_cuda = {c.scenario.recipe for c in cells if facts(c.scenario.tier).cuda
               and not skip_reason(c.scenario.tier, c.world, c.scenario.size, c.scenario.shared_gpu_nccl)}
    if may_need_fp8_extension(on_cuda):
        print(warm_up(), file=out, flush=True)


def none_can_run(cells) -> str | None:
    """One line when this machine can run none of ``cells`` (each would be skipped), else None.

    Why: a run of skipped cells only (a GPU scenario on a CPU host) exits 0, and a CI step that
    runs it goes green with nothing run; refused before any folder is made, it exits 2."""
    reasons = [skip_reason(c.scenario.tier, c.world, c.scenario.size, c.scenario.shared_gpu_nccl)
               for c in cells]
    if not cells or not all(reasons):
        return None
    return f"none of the {len(cells)} cells can run here: {reasons[0]}; nothing run"


def run_cells(cells, results_root: Path, label: str, jobs: int = 1, out=None,
              run_dir: RunDir | None = None) -> dict:
    """Run cells (skipping those this machine cannot run); print progress, then the table.

    Saves run first, then every load, each phase ``jobs`` cells at a time: a load needs its
    save's checkpoint, and cells sharing a save must not race to create it. ``run_dir``: one
    made already (RunDir.new), e.g. for pools started ahead (prestart_save_pools). ``out``:
    default the sys.stdout of the call (not of the import: a test's capture may replace it).
    """
    out = out or sys.stdout
    from harness.report.summary import markdown_summary, progress_line

    run = run_dir or RunDir.new(results_root, label)
    start, lock, state = time.monotonic(), threading.Lock(), {"done": 0, "failures": 0}

    def one(cell) -> None:
        reason = skip_reason(cell.scenario.tier, cell.world, cell.scenario.size,
                             cell.scenario.shared_gpu_nccl)
        if reason:
            rec = _skipped(cell, reason)
            write_record(rec, run.record(cell.id))
        else:
            rec = run_cell(cell, run)
        with lock:
            state["done"] += 1
            state["failures"] += rec.outcome in UNEXPECTED_OUTCOMES
            print(progress_line(state["done"], len(cells), state["failures"],
                                time.monotonic() - start) + f"  {cell.id}: {rec.outcome}",
                  file=out, flush=True)

    _warm_extensions(cells, out)
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            list(pool.map(one, _phase_order([c for c in cells if c.load is None], Stage.SAVE)))
            list(pool.map(one, _phase_order([c for c in cells if c.load is not None], Stage.LOAD)))
    finally:
        POOLS.close_all()  # warm rank pools (HARNESS_STAGE_MODE=pool) never outlive a run
        WARM.end_run()  # nor warm parents (fork), unless kept across runs (pytest)
    doc = collect(run, versions(), interrupted=shutdown_signal())
    print(markdown_summary(doc), file=out)
    print(f"results: {run.results}", file=out)
    return doc


def dump_metadata(topo, tier: str, backend: str, patch: str, out: Path, results_root: Path) -> int:
    from harness.launch.torchrun import run_stage
    from harness.model.gpt import default_size
    from harness.rank.spec import StageSpec

    from harness.topology.topology import TopologyError

    size = default_size(backend)
    try:
        topo.check(size)
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reason = tier_skip_reason(tier, topo.world_size)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    stage_dir = RunDir.new(results_root, f"dump-{topo.id}-{patch}").root
    spec = StageSpec(Stage.DUMP_METADATA, topo.id, tier, backend, "", "", patch=patch,
                     size=size.as_dict(), output=str(out.resolve()))
    run = run_stage(Stage.DUMP_METADATA, stage_dir, topo.world_size,
                    [str(spec.write(stage_dir / "spec.json"))], timeout_s=300)
    print(run.summary())
    return 0 if run.ok else 1
