"""What this machine can run: installed versions, GPUs, and which tiers are available.

Tests and the CLI ask here instead of importing TE themselves: on a CPU machine the bare
``transformer-engine`` package raises RuntimeError at import, which must become a skip reason,
not a collection error.
"""
from __future__ import annotations

import functools
import importlib.metadata as md
import platform
import re
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from harness.check.release import release
from harness.tiers import TIERS, facts
from moe_ckpt_fix.releases import SUPPORTED_MCORE

# megatron-core releases the harness runs on (the model builder, its cpu shims, the probes):
# SUPPORTED_MCORE of moe_ckpt_fix/releases.py. Which (ModelOpt, megatron-core) pairs have a rule
# is a separate question: harness/check/versions.py. Outside the range a run needs the override.
MCORE_OVERRIDE = "HARNESS_ANY_MCORE"  # on: run on an untested megatron-core anyway (recorded)


def version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def te_import_error() -> str | None:
    """None when Transformer Engine's PyTorch API imports, else the reason it does not."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # ImportError, or RuntimeError from the meta package on CPU
        return f"Transformer Engine unavailable ({type(exc).__name__}: {str(exc)[:160]})"
    return None


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# GPU memory one NCCL rank of tier gpu's shared-GPU mode (harness/rank/shared_gpu.py) holds at
# its peak (CUDA context, NCCL buffers, the harness model), measured: 14 ranks (worlds 2, 4, 8 at
# once) on one H100 peaked at 30918 MiB in nvidia-smi (docs/runs/20261206-0532-device-session.md).
SHARED_GPU_NCCL_RANK_MIB = 30918 // 14


def gpu_memory_mib() -> int:
    """The first GPU's memory (MiB); 0 without one."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory // 2**20 if gpu_count() else 0


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if gpu_count() else None


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "megatron-core": version("megatron-core"),
        "nvidia-modelopt": version("nvidia-modelopt"),
        "transformer-engine": version("transformer-engine") or version("transformer_engine"),
        "gpu": gpu_name(),
        "gpu_count": gpu_count(),
        "mcore_override": mcore_overridden(),  # ran outside SUPPORTED_MCORE on request
    }


class SkipKind(StrEnum):
    """What a tier's skip reason says this machine lacks: what code asks of a reason, whose text
    (recorded in results.json as written) is for a reader."""

    UNKNOWN_TIER = "unknown-tier"
    TE_ON_CPU = "te-on-cpu"  # tier cpu on a machine with Transformer Engine installed
    NO_GPU = "no-gpu"  # a GPU tier, no CUDA GPU visible
    TOO_FEW_GPUS = "too-few-gpus"  # tier gpu, fewer GPUs than ranks
    NO_TE = "no-te"  # a GPU tier, Transformer Engine does not import
    GPU_MEMORY = "gpu-memory"  # NCCL ranks sharing a GPU (shared_gpu_nccl) would not fit in it

    @property
    def lacks_gpus(self) -> bool:
        return self in (SkipKind.NO_GPU, SkipKind.TOO_FEW_GPUS)


# Each kind's text, the one place it is written (tier_skip_reason) and read back (skip_kind).
SKIP_TEXTS = {
    SkipKind.UNKNOWN_TIER: "unknown tier {tier!r}; expected one of {tiers}",
    # Seen on the H200 (docs/runs/20261202-204604-matrix): with TE installed, megatron-core
    # sends even the local-spec router GEMM through TE's CUDA kernels.
    SkipKind.TE_ON_CPU: ("tier cpu runs where Transformer Engine is not installed: with TE, "
                         "megatron-core routes the MoE router GEMM through TE's CUDA kernels"),
    SkipKind.NO_GPU: "tier {tier} needs a CUDA GPU; none visible (run the cpu tier here)",
    SkipKind.NO_TE: "tier {tier} needs Transformer Engine: {error}",
    SkipKind.TOO_FEW_GPUS: ("tier gpu needs one GPU per rank: {world} ranks, {gpus} GPU(s) visible "
                            "(tier gpu-shared runs it on fewer GPUs over gloo)"),
    SkipKind.GPU_MEMORY: ("shared_gpu_nccl: {world} NCCL ranks on one GPU need about {need} MiB "
                          "({per} MiB a rank, measured) and the GPU has {total} MiB"),
}


def _pattern(text: str) -> re.Pattern:
    """``text`` as a regex whose fields (``{tier}``, ...) match any words."""
    return re.compile(".*?".join(re.escape(part) for part in re.split(r"\{[^}]*\}", text)), re.S)


_SKIP_PATTERNS = {kind: _pattern(text) for kind, text in SKIP_TEXTS.items()}


def tier_skip_reason(tier: str, world: int = 1, shared_gpu_nccl: bool = False) -> str | None:
    """Why ``tier`` cannot run a ``world``-rank job here, or None when it can. ``shared_gpu_nccl``
    (a scenario asks for it): tier gpu may put several NCCL ranks on one GPU, each its own host
    (harness/rank/shared_gpu.py), so one GPU is enough."""
    if tier not in TIERS:
        return SKIP_TEXTS[SkipKind.UNKNOWN_TIER].format(tier=tier, tiers=", ".join(TIERS))
    if not facts(tier).cuda:
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is not None:
            return SKIP_TEXTS[SkipKind.TE_ON_CPU]
        return None
    if gpu_count() == 0:
        return SKIP_TEXTS[SkipKind.NO_GPU].format(tier=tier)
    if te_import_error():
        return SKIP_TEXTS[SkipKind.NO_TE].format(tier=tier, error=te_import_error())
    if facts(tier).gpu_per_rank and gpu_count() < world and not shared_gpu_nccl:
        return SKIP_TEXTS[SkipKind.TOO_FEW_GPUS].format(world=world, gpus=gpu_count())
    if shared_gpu_nccl:
        ranks_per_gpu = -(-world // gpu_count())
        need, total = ranks_per_gpu * SHARED_GPU_NCCL_RANK_MIB, gpu_memory_mib()
        if need > total:
            return SKIP_TEXTS[SkipKind.GPU_MEMORY].format(
                world=ranks_per_gpu, need=need, per=SHARED_GPU_NCCL_RANK_MIB, total=total)
    return None


def skip_kind(reason: str | None) -> SkipKind | None:
    """The kind of a skip reason ``tier_skip_reason`` wrote (now, or into an earlier record; a
    cell's reason may go on with the model's), None for any other reason."""
    return next((kind for kind, pattern in _SKIP_PATTERNS.items() if pattern.match(reason or "")),
                None)


def model_skip_reason(size) -> str | None:
    """Why this machine cannot build ``size``'s optional modules, in one line: a package they
    need (harness/model/modules.py ``packages_needed``) is not installed, or the installed
    megatron-core lacks a module they build from (``megatron_files_needed``). Looked up, not
    imported: the controller touches no GPU library (a broken install fails in its stage)."""
    import importlib.util

    from harness.model.modules import megatron_files_needed, packages_needed

    missing = [f"needs {package}: {why}, and it is not installed"
               for module, package, why in packages_needed(size)
               if importlib.util.find_spec(module) is None]
    needed = megatron_files_needed(size)
    core = _megatron_core_dir() if needed else None  # looked for only by a model that needs it
    missing += [f"needs megatron/core/{rel} ({what}), which megatron-core {version('megatron-core')} "
                "does not have" for rel, what in needed if core is not None and not (core / rel).is_file()]
    return "; ".join(missing) or None


def _megatron_core_dir() -> Path | None:
    """megatron/core/ of the installed megatron-core, found without importing it (its __init__
    imports torch and Transformer Engine), or None when none is installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("megatron.core")
    except ImportError:  # no megatron at all
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def skip_reason(tier: str, world: int = 1, size=None, shared_gpu_nccl: bool = False) -> str | None:
    """Why a cell of ``tier`` on ``world`` ranks that builds ``size`` cannot run here, in one
    line (the tier's reason, then the model's), or None when it can."""
    reasons = [tier_skip_reason(tier, world, shared_gpu_nccl),
               model_skip_reason(size) if size is not None else None]
    return "; ".join(r for r in reasons if r) or None


class VersionProblem(NamedTuple):
    line: str
    fatal: bool  # nothing can run (a package missing, an untested megatron-core); else a warning


def _not_installed(dist: str) -> str:
    """The line for a package this Python lacks: where the project's environment exists and this
    is another Python (``python3 -m harness``), its command; else how to make it."""
    import sys

    from harness.paths import REPO_ROOT

    venv = REPO_ROOT / ".venv" / "bin" / "python"
    if venv.exists() and Path(sys.prefix).resolve() != (REPO_ROOT / ".venv").resolve():
        return (f"{dist} is not installed in this Python ({sys.executable}); the project's "
                f"environment is .venv: run `.venv/bin/python -m harness ...` (or `make <target>`)")
    return f"{dist} is not installed (run `make test` or tools/bootstrap-venv.sh)"


def version_problem() -> VersionProblem | None:
    """A clear message when a package is missing or at a version this harness was not built for."""
    overridden = mcore_overridden()  # read first: a bad value stops the run, needed here or not
    mc = version("megatron-core")
    if mc is None:
        return VersionProblem(_not_installed("megatron-core"), fatal=True)
    problem = mcore_problem(mc)
    if problem:
        return VersionProblem(problem, fatal=not overridden)
    mo = version("nvidia-modelopt")
    if mo is None:
        return VersionProblem("nvidia-modelopt is not installed", fatal=True)
    from harness.check.versions import rules_for

    notice = rules_for(mo, mc).notice(mo, mc)  # no rule for the pair: its cells are rule-unknown
    return VersionProblem(notice, fatal=False) if notice else None


def mcore_overridden() -> bool:
    from harness.switches import switch

    return switch(MCORE_OVERRIDE)


def mcore_problem(mc: str) -> str | None:
    """One line when megatron-core ``mc`` is outside the tested range (an error unless the
    override is set, then a warning that results records carry)."""
    if release(mc) in SUPPORTED_MCORE:
        return None
    line = (f"megatron-core {mc} is untested by this harness (tested: {', '.join(SUPPORTED_MCORE)}): "
            "the model builder, the cpu shims and the probes were not run on it, and no "
            "(ModelOpt, megatron-core) rule covers it")
    if mcore_overridden():
        return f"{line}; running anyway ({MCORE_OVERRIDE}=1)"
    return f"{line}; set {MCORE_OVERRIDE}=1 to run anyway"
