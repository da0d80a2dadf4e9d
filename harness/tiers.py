"""The three tiers and every fact about them, in one table.

Why: a tier decides the model backend, the ranks' process group, whether ranks compute on
CUDA, how many GPUs a cell needs and how its stages start; spelled out in one place, a new
fact or a new tier is one row here, and no other module compares a tier's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Tier(StrEnum):
    CPU = "cpu"  # gloo ranks on CPU, megatron-core local spec, SequentialMLP, no TE
    GPU_SHARED = "gpu-shared"  # N gloo ranks sharing fewer GPUs, TE TEGroupedMLP
    GPU = "gpu"  # NCCL, one rank per GPU


class Backend(StrEnum):
    """The model's MoE experts (harness/model/gpt.py)."""

    TE = "te"  # Transformer Engine TEGroupedMLP with per-expert quantizers (the report's path)
    LOCAL = "local"  # megatron-core local spec, SequentialMLP


class StageMode(StrEnum):
    """How a stage starts (harness/launch/pool.py)."""

    FRESH = "fresh"  # a torchrun of its own (the reference)
    POOL = "pool"  # a job of a warm rank pool
    FORK = "fork"  # ranks forked from a warm parent by torch's elastic launcher


@dataclass(frozen=True)
class TierFacts:
    backend: Backend  # the model its scenarios, samples and goldens build
    process_group: str  # torch.distributed backend of its ranks
    # Ranks compute on CUDA: ModelOpt's NVFP4 fake-quant kernels, megatron-core's pipeline
    # schedule (its receive buffers: saves and logits at pp > 1), a bf16 forward (so a noise
    # floor is measured), Transformer Engine. Off CUDA the forward is fp32 and TE must be absent.
    cuda: bool
    gpu_per_rank: bool  # NCCL: one GPU per rank; else the ranks share the GPUs there are
    # The default stage mode (HARNESS_STAGE_MODE overrides): one shown to give the fresh mode's
    # results cell for cell there (docs/benchmarks.md, "Stage startup"): fork on cpu,
    # the pool on gpu-shared (fork is equivalent on make repro's six cells there but not shown
    # faster: its ranks import ModelOpt after the fork, docs/runs/20261207-0748-fork-on-gpu.md);
    # tier gpu keeps the reference until it is shown there.
    stage_mode: StageMode
    # Asserted: loaded model vs the saved state written into a model at the load topology.
    logits_tolerance: float = 0.0
    # After the first failure, how long torchrun may tear the job down by itself before the
    # controller kills the session. Gloo peers leave at once ("Connection closed by peer").
    # NCCL peers sit in a collective that never errors (measured, NCCL ranks sharing one H100:
    # still alive after 3 s at world 2, 4 and 8, docs/runs/20261206-0532-device-session.md).
    teardown_grace_s: float = 3.0
    # What a fork-mode warm parent (harness/rank/warm.py) imports before it forks ranks: None,
    # the whole stack a stage imports (rank/setup.py import_stack, the fix applied first); else
    # these modules only. A parent must not initialize CUDA: on the GPU host importing ModelOpt
    # does (docs/benchmarks.md, "Imports, GPU"), torch, TE and megatron-core do not.
    fork_preload: tuple[str, ...] | None = None


_NO_CUDA_INIT = ("torch", "transformer_engine.pytorch", "megatron.core")
TABLE = {
    Tier.CPU: TierFacts(Backend.LOCAL, "gloo", cuda=False, gpu_per_rank=False,
                        stage_mode=StageMode.FORK),
    Tier.GPU_SHARED: TierFacts(Backend.TE, "gloo", cuda=True, gpu_per_rank=False,
                               stage_mode=StageMode.POOL, fork_preload=_NO_CUDA_INIT),
    Tier.GPU: TierFacts(Backend.TE, "nccl", cuda=True, gpu_per_rank=True,
                        stage_mode=StageMode.FRESH, teardown_grace_s=1.0,
                        fork_preload=_NO_CUDA_INIT),
}
TIERS = tuple(t.value for t in Tier)
BACKENDS = tuple(b.value for b in Backend)
STAGE_MODES = tuple(m.value for m in StageMode)
# The pytest mark of each tier's cells (conftest.py): its name as an identifier, registered in
# pyproject.toml, so `-m gpu_shared` selects them.
MARKS = {t: t.value.replace("-", "_") for t in Tier}


def facts(tier: str) -> TierFacts:
    """The facts of ``tier`` (a Tier or its name as records and specs hold it)."""
    return TABLE[Tier(tier)]


def on_cuda(tier: str | None) -> bool:
    """Whether ``tier``'s ranks compute on CUDA (None, no tier: not)."""
    return tier is not None and facts(tier).cuda


def gpus_needed(tier: str, ranks: int, shared_gpus: int = 1) -> int:
    """The fewest GPUs a cell of this tier and size can run on."""
    f = facts(tier)
    if not f.cuda:
        return 0
    return ranks if f.gpu_per_rank else max(1, min(shared_gpus, ranks))
