"""Warm rank pool, rank side: ``torchrun ... -m harness.rank.serve <pool_dir>``.

Why: importing torch, megatron-core and ModelOpt is about half of a cpu-tier stage. A pool
rank pays for it once, then runs consecutive stages of one world size in the same process,
each exactly as ``python -m harness.rank`` would (rank/guard.py: the same rank log, stack
dumps, result and error files in the stage directory). A rank imports the stack (the fix
applied first) as soon as it starts (``preload``), so a pool started ahead of its first stage
imports while the controller works; the first stage's own prepare_rank imports again (a no-op
then, the real failure if the preload failed: that stage's, as in a fresh torchrun) and joins
the default process group; later stages find them in place. Between stages
megatron's parallel state is destroyed and re-created, as megatron's own unit tests do. Any
failure ends the process like rank_main does; the controller (harness/launch/pool.py) then
replaces the whole pool.

Files under <pool_dir>: the controller writes ``jobs/<seq>.json`` ({seq, stage, spec,
stage_dir, deadline, env}, or {seq, stop}); every rank takes the jobs in order 1, 2, ... and,
after a stage and the reset, writes ``done/<seq>.rank<r>``. Between stages a rank's output and
stack dumps go to ``<pool_dir>/logs`` and ``<pool_dir>/stacks``.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

POLL_S = 0.02
OWNER_CHECK_S = 1.0  # how often an idle rank checks that the controller is still there
STAGE_VARS = ("HARNESS_STAGE_DIR", "HARNESS_STAGE", "HARNESS_STAGE_TIMEOUT_S", "HARNESS_STAGE_TOKEN")


def _owner_alive() -> bool:
    owner = int(os.environ.get("HARNESS_POOL_OWNER", "0"))
    if not owner:
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def next_job(pool_dir: Path, seq: int) -> dict:
    """Wait for job ``seq``; a controller gone without a word counts as a stop."""
    path = pool_dir / "jobs" / f"{seq}.json"
    checked = time.monotonic()
    while not path.exists():  # written atomically: there means complete
        time.sleep(POLL_S)
        if time.monotonic() - checked > OWNER_CHECK_S:
            checked = time.monotonic()
            if not _owner_alive():
                return {"seq": seq, "stop": True, "why": "controller gone"}
    return json.loads(path.read_text())


def _job_env(job: dict, limit_s: float) -> None:
    """What a fresh torchrun gets in its environment for this stage (launch/command.py stage_env)."""
    os.environ.update({"HARNESS_STAGE_DIR": job["stage_dir"], "HARNESS_STAGE": job["stage"],
                       "HARNESS_STAGE_TIMEOUT_S": str(limit_s),
                       "HARNESS_STAGE_TOKEN": job.get("token", "")})
    for k, v in job.get("env", {}).items():  # variables rank code reads per stage (inject)
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _body(job: dict) -> dict:
    from harness.rank.spec import StageSpec
    from harness.rank.stages import STAGES

    spec = StageSpec.read(job["spec"])
    pool = (os.environ.get("HARNESS_POOL_TIER"), os.environ.get("HARNESS_POOL_PATCH"))
    if (spec.tier, spec.patch) != pool:  # the fix cannot be undone: never mix patches
        raise RuntimeError(f"stage for tier {spec.tier} patch {spec.patch} sent to a pool for "
                           f"tier {pool[0]} patch {pool[1]}")
    return STAGES[spec.stage](spec)


def reset() -> None:
    """Leave no megatron state for the next stage: parallel state destroyed, every subgroup
    torn down (torch keeps them otherwise; many accumulated gloo groups stall group creation,
    see run/validation_probes.py probe_oracle_world), the model collected, then all ranks in step."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.distributed import distributed_c10d as c10d

    ps.destroy_model_parallel()
    _stop_save_manager()
    world = c10d._get_default_group()
    names = c10d._world.pg_names
    # the same order on every rank (group names come from one counter): safe on NCCL too
    for pg in sorted((g for g in list(c10d._world.pg_map) if g is not world),
                     key=lambda g: names.get(g, ""), reverse=True):
        dist.destroy_process_group(pg)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    dist.barrier()


def _stop_save_manager() -> None:
    """megatron's torch_dist save keeps a spawn Manager for its write results in a module global
    (filesystem_async._results_queue); a fresh rank leaves it behind when it exits. Shut it down
    so no helper process of one stage lives into the next (the next save starts its own)."""
    fs = sys.modules.get("megatron.core.dist_checkpointing.strategies.filesystem_async")
    queue = getattr(fs, "_results_queue", None)
    if queue is None:
        return
    fs._results_queue = None
    manager = getattr(queue, "_manager", None)
    if manager is not None:
        manager.shutdown()


def preload() -> float:
    """Import the pool's stack before the first job; returns when it began (epoch).

    Why: a pool started ahead of its first stage (launch/pool.py ``PoolSet.prestart``) does its
    imports while the controller is still busy. A failure here is only printed to the pool's
    log: the first stage's own prepare_rank imports again and fails as that stage's error, as
    in a fresh torchrun."""
    import traceback

    from harness.rank.setup import import_stack

    began = time.time()
    try:
        import_stack(os.environ.get("HARNESS_POOL_TIER"), os.environ.get("HARNESS_POOL_PATCH"))
    except Exception:  # noqa: BLE001 - re-raised by the first stage's own imports
        print("[serve] preload failed; the first stage imports again:\n"
              + traceback.format_exc(), file=sys.stderr, flush=True)
    return began


def _with_preload(result: dict, preloaded_at: float | None) -> dict:
    """The first stage after a preload: its clock starts at the preload, whose phase
    (``preload``: the imports, then any wait for this job) comes first, so the phases
    still add up to the stage wall (run/cell.py ``_note_stage``)."""
    if preloaded_at is None or not isinstance(result, dict) or "clock_started_at" not in result:
        return result
    waited = round(result["clock_started_at"] - preloaded_at, 3)
    return {**result, "clock_started_at": preloaded_at,
            "durations": {"preload": waited, **result.get("durations", {})}}


def run_job(rank: int, pool_dir: Path, job: dict, preloaded_at: float | None = None) -> None:
    """One stage under the guard, then the reset; any failure ends this process."""
    from harness.jsonfile import write_json_atomic
    from harness.rank import guard

    sd, stage = Path(job["stage_dir"]), job["stage"]
    limit_s = max(1.0, float(job["deadline"]) - time.time())
    _job_env(job, limit_s)
    guard.enter_stage(rank, sd, limit_s)
    if job["seq"] > 1:  # the first stage's peak includes the imports, as a fresh rank's does
        from harness.rank.setup import reset_peak_memory

        reset_peak_memory()
    result = _with_preload(guard.guarded(stage, rank, sd, lambda: _body(job)), preloaded_at)
    guard.guarded(stage, rank, sd, lambda: (guard.write_result(rank, sd, result), reset()))
    del result
    done = pool_dir / "done" / f"{job['seq']}.rank{rank}"
    guard.guarded(stage, rank, sd, lambda: write_json_atomic(done, {"pid": os.getpid(),
                                                                   "time": time.time()}))


def main(argv: list[str]) -> None:
    from harness.rank import trim

    trim.install()  # before anything imports the stack
    from harness.rank import guard
    from harness.rank.stages import configure_warnings

    configure_warnings()
    pool_dir = Path(argv[0]).resolve()
    rank = int(os.environ["RANK"])
    seq, preloaded_at = 1, None
    while True:
        guard.enter_stage(rank, pool_dir, limit_s=0)  # idle: the pool's own log, no timer
        if seq == 1:
            preloaded_at = preload()
        job = next_job(pool_dir, seq)
        if job.get("stop"):
            print(f"[serve] stop after {seq - 1} stages: {job.get('why', 'asked')}", flush=True)
            for k in STAGE_VARS:
                os.environ.pop(k, None)
            guard.guarded("pool-stop", rank, pool_dir, guard.destroy_process_group)
            guard.leave(0)
        print(f"[serve] job {seq}: {job['stage']} in {job['stage_dir']}", flush=True)
        run_job(rank, pool_dir, job, preloaded_at if seq == 1 else None)
        seq += 1


if __name__ == "__main__":  # the torch_dist save's spawn Manager re-imports this module
    main(sys.argv[1:])
