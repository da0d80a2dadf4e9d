"""Where a stage starts: the one home of the stage-mode dispatch (``HARNESS_STAGE_MODE``).

Three ways to start a stage's ranks, picked by ``launch/pool.py stage_mode`` for the tier:
``pool`` hands a cell's stage to a warm rank pool (launch/pool.py), ``fork`` forks its ranks
from a warm parent (launch/warm.py), ``fresh`` starts a torchrun of its own
(launch/torchrun.py). Each comes back as the same StageRun. A warm rank pool serves only the
stages of cells (``pool=True``, run/cell.py); any other stage (a validation probe, a test's
rank program) in pool mode starts fresh.
"""
from __future__ import annotations

from pathlib import Path

from harness.launch.pool import POOLS, PoolKey, stage_mode
from harness.launch.torchrun import StageRun, run_stage
from harness.launch.warm import WARM, parent_key
from harness.records import Patch
from harness.tiers import Backend, StageMode, Tier


def run_module_stage(stage: str, stage_dir: Path, nproc: int, rank_args: list[str], timeout_s: float,
                     rank_module: str = "harness.rank", *, root: Path | None = None,
                     env: dict | None = None, tier: str = Tier.CPU, patch: str = Patch.NONE,
                     backend: str = Backend.LOCAL, pool: bool = False, **kw) -> StageRun:
    """A stage of ``rank_module`` started as ``tier`` starts its stages.

    ``pool``: the stage is a cell's (``rank_args`` is its one spec file), and a warm rank pool
    of (world, tier, patch, backend, env) runs it where the tier's mode is pool. Else the ranks
    are forked from the warm parent of (tier, patch, backend, env) where the mode is fork, or
    start as a fresh torchrun. ``root``: the run directory whose ``pools/`` holds pools and
    parents (default: the stage directory's parent)."""
    mode = stage_mode(tier)
    root = Path(root or Path(stage_dir).parent)
    if mode == StageMode.POOL and pool:
        key = PoolKey.of(nproc, tier, patch, backend, root, env)
        return POOLS.run(key, Path(rank_args[0]), stage, stage_dir, timeout_s)
    if mode == StageMode.FORK:
        return WARM.run(parent_key(tier, patch, backend, root, env), stage, stage_dir, nproc,
                        rank_args, timeout_s, env, rank_module=rank_module, **kw)
    return run_stage(stage, stage_dir, nproc, rank_args, timeout_s, env, rank_module=rank_module, **kw)
