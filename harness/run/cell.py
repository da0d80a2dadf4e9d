"""Run one cell: a save stage (shared by every cell with the same save), then a load stage;
each a torchrun of its own, or a job of a warm rank pool (HARNESS_STAGE_MODE=pool).

Each stage comes back as a typed StageResult (harness/records.py); harness/check/judge.py turns
them into the cell's record, judged under the ModelOpt that the ranks imported.
"""
from __future__ import annotations

import fcntl
import threading
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

from harness.check import judge
from harness.check.decision import CellDecision, decide, decision_fields
from harness.check.versions import installed_mcore, installed_modelopt, rules_for
from harness.jsonfile import read_json, write_json_atomic
from harness.launch.pool import stage_mode
from harness.launch.stages import run_module_stage
from harness.launch.signals import shutdown_signal
from harness.paths import GOLDEN_DIR, RunDir, SaveDir
from harness.rank.spec import StageSpec
from harness.records import CellRecord, Stage, StageResult, check_record
from harness.run.results import write_record
from harness.run.saved import checkpoint_amax_keys, verified_save
from harness.scenario.cells import Cell
from harness.tiers import facts


def _spec(cell: Cell, stage: str, topo, save: SaveDir) -> StageSpec:
    s = cell.scenario
    return StageSpec(
        stage=stage, topology=topo.id, tier=s.tier, backend=s.backend,
        ckpt_dir=str(save.ckpt), reference_dir=str(save.reference),
        patch=s.patch, recipe=s.recipe, size=s.size.as_dict(),
        singleton_local_shards=s.singleton_local_shards, strict_load=s.strict_load,
        dist_ckpt_strictness=s.dist_ckpt_strictness, megatron_lm_load=s.megatron_lm_load,
        logits_reference=s.logits_reference,
    )


_save_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)


def run_save(cell: Cell, run_dir: RunDir | Path) -> StageResult:
    """The save stage for ``cell.save_id``; reused when an earlier cell already ran it.

    One save runs once per run directory, whichever thread or process (pytest-xdist workers
    share the run directory) asks first; the others wait for it here and reuse its result.
    Golden cells have no save-only cell to run first, so concurrent loads of one golden
    serialize here on its preparation. A save that passed counts only once its checkpoint is
    checked (harness/run/saved.py).
    """
    run = RunDir.of(run_dir)
    save = run.save(cell.save_id)
    with _save_locks[str(save.root)], _held(save.lock):
        if save.result.exists():
            return StageResult.from_json(read_json(save.result), source=str(save.result))
        if cell.golden:
            result = prepare_golden(cell.golden, save, cell.scenario.golden_root)
        else:
            result = _launch(_spec(cell, Stage.SAVE, cell.save, save), save.root, cell, run)
            result = verified_save(save, result, cell.save.id, cell.save.world_size)
        write_json_atomic(save.result, check_record(StageResult, result.to_json(), str(save.result)),
                          indent=2)
        return result


@contextmanager
def _held(lock: Path):
    """An exclusive flock on ``lock`` (created with its directory) for the block: across
    processes, as the thread lock above is within one."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_golden(name: str, save: SaveDir | Path, golden_root: Path = GOLDEN_DIR) -> StageResult:
    """Stand-in for a save stage: a verified copy of the golden and its expected state.

    The copy (harness.golden.manifest.copy_to_temp) keeps the committed bytes out of every
    load's reach; the layout comes from the checkpoint's metadata before anything loads it.
    """
    import shutil
    import time

    from harness.check.expect import expected_state, read_checkpoint_tensors, write_reference
    from harness.golden.layout import inspect_checkpoint
    from harness.golden.manifest import copy_to_temp
    from harness.scenario.goldens import golden_topology

    start = time.monotonic()
    save = save if isinstance(save, SaveDir) else SaveDir(Path(save))
    save.root.mkdir(parents=True, exist_ok=True)
    copy = copy_to_temp(golden_root / name, into=save.root)
    shutil.move(str(copy / "ckpt"), str(save.ckpt))
    shutil.rmtree(copy.parent)
    layout = inspect_checkpoint(save.ckpt)
    exp = expected_state(read_checkpoint_tensors(save.ckpt), _runtime_layout())
    write_reference(exp, save.reference, golden_topology(name, golden_root).id)
    summary = (f"golden {name}: layout {layout.kind}, "
               f"{sum(len(v) for v in layout.missing.values())} expert amax missing; "
               f"expected state {exp.summary()}")
    return StageResult(stage=Stage.GOLDEN, ok=True, wall_s=round(time.monotonic() - start, 2),
                       summary=summary, amax_keys=checkpoint_amax_keys(save.ckpt),
                       rank_results={"0": {"layout": layout.as_json(), "expected": exp.summary()}})


def _runtime_layout() -> str:
    """The quantizer layout of the modelopt the load ranks import (this interpreter's)."""
    return rules_for(installed_modelopt(), installed_mcore()).layout  # the installed pair's


def _launch(spec: StageSpec, stage_dir: Path, cell: Cell, run: RunDir) -> StageResult:
    """A cell's stage, started as its tier starts stages (launch/stages.py: a warm rank pool,
    ranks forked from a warm parent, or a fresh torchrun; HARNESS_STAGE_MODE)."""
    spec_path = spec.write(stage_dir / "spec.json")
    return run_module_stage(spec.stage, stage_dir, spec.topo.world_size, [str(spec_path)],
                            cell.scenario.stage_timeout_s, root=run.root, env=rank_env(cell.scenario),
                            tier=spec.tier, patch=spec.patch, backend=spec.backend, pool=True,
                            grace_s=facts(spec.tier).teardown_grace_s).result()


def rank_env(s) -> dict:
    """The environment a scenario's ranks get beside the controller's, which keys their pool."""
    return {**_tier_env(s.tier, s.shared_gpu_nccl), **fix_env(s.fix_parts)}


def fix_env(parts: tuple[str, ...]) -> dict:
    """The fix's parts the scenario needs are asked for by name where they are still unproven
    (MOE_CKPT_FIX_UNPROVEN; a version the controller's names is kept, and the installed version
    is added where the fix has only unproven parts for it): what the forecast assumed, and the
    pool key then never mixes stages with and without them. A proven part needs no asking."""
    from harness.check.versions import installed_modelopt  # read when called (tests patch it)
    from harness.fix import PARTS, UNPROVEN_MODELOPT_VERSIONS, UNPROVEN_VAR, asked_words

    kept = [w for w in asked_words() if w not in PARTS]
    version = installed_modelopt()
    if parts and version in UNPROVEN_MODELOPT_VERSIONS and version not in kept:
        kept.append(version)
    return {UNPROVEN_VAR: ",".join(kept + list(parts))}


def _tier_env(tier: str, shared_gpu_nccl: bool = False) -> dict:
    env = {}
    if facts(tier).process_group == "nccl":
        from harness.rank.guard import nccl_env

        env.update(nccl_env())
    if shared_gpu_nccl:  # the ranks set their own NCCL host ids (harness/rank/shared_gpu.py)
        from harness.rank.shared_gpu import SHARED_GPU_ENV

        env[SHARED_GPU_ENV] = "1"
    return env


def new_record(cell: Cell, decision: CellDecision | None = None) -> CellRecord:
    """The cell's record before its stages run, with the controller's decision's fields (the
    decision worked out here when not given): built once, nothing written into it after."""
    s = cell.scenario
    shared = {}
    if s.shared_gpu_nccl:  # said in the record and the report, never a silent stand-in
        from harness.rank.shared_gpu import describe
        from harness.machine import gpu_count

        shared["nccl_mode"] = describe(cell.world, gpu_count())
    return CellRecord(
        scenario=s.name, cell_id=cell.id, tier=s.tier, backend=s.backend,
        save_topology=cell.save.id, load_topology=cell.load.id if cell.load else None,
        patch=s.patch, stage_mode=stage_mode(s.tier), recipe=s.recipe, timed_out=False,
        model=s.size.record(), **shared, **decision_fields(decision or controller_decision(cell)),
    )


def controller_decision(cell: Cell) -> CellDecision:
    """The cell's decision under the pair installed here, from the recipe's forecast: what it
    is expected to do before any stage runs, and whether it runs at all."""
    return decide(cell.plan, installed_modelopt(), None)


def run_cell(cell: Cell, run_dir: RunDir | Path) -> CellRecord:
    """Run what the cell needs (nothing when stopped or when the installed modelopt cannot run
    it), note the stages' durations, then judge it once (harness/check/judge.py judge_cell)."""
    run = RunDir.of(run_dir)
    decision = controller_decision(cell)
    rec = new_record(cell, decision)
    save = load = None
    stopped = shutdown_signal()
    if not stopped and not decision.skip:
        save = run_save(cell, run)
        _note_stage(rec, Stage.SAVE, save)
        if cell.load is not None and save.ok and not save.interrupted:
            spec = _spec(cell, Stage.LOAD, cell.load, run.save(cell.save_id))
            load = _launch(spec, run.stage(cell.id, Stage.LOAD), cell, run)
            _note_stage(rec, Stage.LOAD, load)
    rec = judge.judge_cell(rec, cell.plan, save, load, stopped, decision)
    write_record(rec, run.record(cell.id))
    return rec


def _note_stage(rec: CellRecord, which: str, stage: StageResult) -> None:
    """The stage's durations (rank 0's phases), peak memory (largest rank, sum of ranks) and
    whether it ran past its limit.

    Rank 0's phases are framed by ``start`` (the stage started -> its clock started: torchrun's
    agent, the interpreter, importing torch and the harness; in a warm pool, taking the job)
    and ``exit`` (its result written -> every rank and torchrun gone: destroying the process
    group, leaving; in a pool, the reset), so that the phases add up to the stage wall."""
    rec.durations[f"{which}_stage"] = stage.wall_s
    rec.timed_out = bool(rec.timed_out or stage.timed_out)
    r0 = stage.rank0
    clock, written = r0.get("clock_started_at"), r0.get("result_written_at")
    if stage.started_at is not None and clock is not None:
        rec.durations[f"{which}.start"] = round(clock - stage.started_at, 3)
    rec.durations.update({f"{which}.{k}": v for k, v in r0.get("durations", {}).items()})
    if stage.started_at is not None and written is not None:
        rec.durations[f"{which}.exit"] = round(stage.started_at + stage.wall_s - written, 3)
    peaks = [r["memory"] for r in stage.rank_results.values() if r.get("memory")]
    if peaks:
        rec.memory[which] = {"ranks": len(peaks)}
        for key in sorted({k for p in peaks for k in p}):
            values = [p[key] for p in peaks if key in p]
            if all(isinstance(v, (int, float)) for v in values):
                rec.memory[which].update({f"{key}_max": max(values), f"{key}_sum": round(sum(values), 1)})
            else:  # a word (rss_peak_scope): the ranks' words, once each
                rec.memory[which][key] = "/".join(sorted(set(map(str, values))))
