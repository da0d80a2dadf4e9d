"""What every stage does first on its rank: imports, the fix, process groups, the model."""
from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from harness.rank import inject
from harness.rank.spec import StageSpec
from harness.records import FIX_ENV_KEY, FIX_PARTS_ENV_KEY, Patch
from harness.tiers import facts, on_cuda
from harness.topology.topology import Topology


def backend_for(tier: str) -> str:
    return facts(tier).process_group


def init_rank(topo: Topology, tier: str, pg_timeout_s: float) -> int:
    """Join the job's process group (unless this process already has, in a warm rank pool)
    and build megatron's parallel groups for ``topo`` (every stage)."""
    from megatron.core import parallel_state as ps

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != topo.world_size:
        raise RuntimeError(f"torchrun started {world} ranks but {topo.id} needs {topo.world_size}")
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
    if not dist.is_initialized():
        from harness.rank import shared_gpu

        shared_gpu.apply(rank)  # before NCCL reads its host id
        dist.init_process_group(
            backend=backend_for(tier), timeout=timedelta(seconds=pg_timeout_s)
        )
    elif dist.get_world_size() != world or dist.get_backend() != backend_for(tier):
        # a warm rank pool (harness/rank/serve.py) keeps its default group between stages
        raise RuntimeError(f"the process group joined earlier ({dist.get_world_size()} ranks, "
                           f"{dist.get_backend()}) does not fit {topo.id} on tier {tier}")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=topo.tp,
        pipeline_model_parallel_size=topo.pp,
        expert_model_parallel_size=topo.ep,
        expert_tensor_parallel_size=topo.etp,
    )
    return rank


class Clock:
    """Per-phase durations of a stage, reported in ranks/rank<r>.json. ``started_at`` (epoch)
    lets the controller tell the time before the first phase (run/cell.py ``_note_stage``)."""

    def __init__(self):
        self.t, self.durations = time.perf_counter(), {}
        self.started_at = time.time()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.durations[name] = round(now - self.t, 3)
        self.t = now


PROC_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")  # "5" resets the kernel's peak RSS (VmHWM), Linux >= 4.0


def reset_peak_memory() -> None:
    """Start this process's peaks over: host RSS (the kernel's high-water mark) and the CUDA
    caching allocator's. A warm pool rank calls it before each stage (rank/serve.py), so a stage
    reports its own peak, not its predecessors' (a pooled rank's getrusage peak is its whole
    life's, and the allocator's peak is never reset by itself)."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass  # no such file (not Linux) or not allowed: peak_memory says which peak it read
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict:
    """This rank's peak host RSS since its last ``reset_peak_memory`` (the kernel's VmHWM; where
    /proc has none, getrusage's, over the process's life: ``rss_peak_scope`` says which) and, on
    a GPU, the peak memory its CUDA caching allocator reserved (the CUDA context itself, a few
    hundred MiB per process, is not included)."""
    import re

    try:
        kib = int(re.search(r"^VmHWM:\s+(\d+) kB", PROC_STATUS.read_text(), re.M).group(1))
        out = {"rss_peak_mib": round(kib / 1024, 1), "rss_peak_scope": "since-reset"}
    except (OSError, AttributeError):
        import resource

        out = {"rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "rss_peak_scope": "process"}
    if torch.cuda.is_available():
        out["gpu_peak_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return out


def mcore_shims_applied() -> list[str]:
    from harness.model.mcore_shims import applied

    return applied()


def import_stack(tier: str | None, patch: str | None) -> None:
    """The stack a stage imports, the cpu shims and the fix applied first as they must be
    (both idempotent). Called by every stage (prepare_rank) and, before its first job, by a
    warm pool's ranks (rank/serve.py ``preload``)."""
    if tier is not None and not on_cuda(tier):
        from harness.model.cpu_shims import apply_cpu_shims

        apply_cpu_shims()
    if patch == Patch.FIX:
        from harness.fix import apply

        apply()
    import megatron.core  # noqa: F401  (timed as imports)
    import modelopt.torch.quantization  # noqa: F401

    from harness.model.mcore_shims import shim_config_warnings

    shim_config_warnings()  # before record_environment, so the record names it (0.15.x only)

    import harness.model.gpt  # noqa: F401


def prepare_rank(spec: StageSpec, clock: Clock):
    """Imports, patch, process groups, model: the part both stages share."""
    import_stack(spec.tier, spec.patch)
    from harness.model.gpt import build_gpt
    from harness.rank.guard import pg_timeout_s

    clock.lap("imports")
    record_environment()
    rank = init_rank(spec.topo, spec.tier, pg_timeout_s())
    model = build_gpt(spec.topo, spec.model_size, spec.backend, spec.seed)
    inject.point("after_build")
    clock.lap("build")
    return rank, model


def record_environment() -> None:
    """Rank 0 notes the package versions it imported, before anything can fail: the controller
    judges the cell by the nvidia-modelopt that actually ran (harness/check/versions.py)."""
    import os

    if os.environ.get("RANK", "0") != "0" or not os.environ.get("HARNESS_STAGE_DIR"):
        return
    import megatron.core
    import modelopt

    from harness.jsonfile import write_json_atomic

    te = sys.modules.get("transformer_engine")
    fix = sys.modules.get("moe_ckpt_fix")  # imported (as harness.fix) only by a patched stage
    write_json_atomic(Path(os.environ["HARNESS_STAGE_DIR"]) / "environment.json", {
        FIX_ENV_KEY: fix.applied() if fix else None,
        FIX_PARTS_ENV_KEY: list(fix.applied_parts()) if fix else [],
        "nvidia-modelopt": modelopt.__version__, "megatron-core": megatron.core.__version__,
        "torch": torch.__version__, "transformer-engine": getattr(te, "__version__", None),
        "modelopt_path": str(Path(modelopt.__file__).parent),
        # version-gated shims this stage ran with (harness/model/mcore_shims.py), said in results
        "shims": mcore_shims_applied(),
    })


def device():
    return torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
