"""Controller side: the command line and environment of one stage's torchrun.

Why: what a rank sees at start (its stage directory, timeouts, the variables a parent torchrun
or pytest-xdist left behind, removed) is decided here once, for fresh stages and warm pools.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from harness.launch.extensions import extensions_dir
from harness.paths import REPO_ROOT

# Variables a parent torchrun/pytest-xdist might have set that would confuse the ranks.
STRIP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")


# The stage's token: every rank stamps it into its result (harness/rank/guard.py write_result);
# the controller counts only results that carry it, so a result some other stage or controller
# left in the directory can never stand in for a rank of this one.
TOKEN_ENV = "HARNESS_STAGE_TOKEN"


def new_stage_token() -> str:
    return uuid.uuid4().hex


def stage_env(stage: str, stage_dir: Path, timeout_s: float, pg_timeout_s: float | None, extra: dict | None,
              token: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in STRIP_ENV and k != TOKEN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["HARNESS_STAGE_DIR"] = str(stage_dir)
    env["HARNESS_STAGE"] = stage
    env["HARNESS_STAGE_TIMEOUT_S"] = str(timeout_s)
    if token:
        env[TOKEN_ENV] = token
    env.setdefault("HARNESS_PG_TIMEOUT_S", str(pg_timeout_s if pg_timeout_s is not None else 60))
    # cuBLAS picks a fixed reduction order only with a fixed workspace; the logits probe runs
    # under torch's deterministic algorithms (harness/rank/logits.py), which ask for this
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # ModelOpt's CUDA extensions in a directory of this ModelOpt version (harness/launch/extensions.py)
    env["TORCH_EXTENSIONS_DIR"] = extensions_dir(env)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def make_stage_dirs(stage_dir: Path) -> None:
    for sub in ("logs", "errors", "stacks", "ranks"):
        (stage_dir / sub).mkdir(parents=True, exist_ok=True)


def start_torchrun(nproc: int, rank_module: str, rank_args: list[str], log_path: Path, env: dict,
                   python: str = sys.executable) -> subprocess.Popen:
    """One single-node torchrun in a session of its own, its output in ``log_path``."""
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--max-restarts", "0",
           "-m", rank_module, *rank_args]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env, cwd=REPO_ROOT)
