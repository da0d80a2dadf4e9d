"""Make a golden checkpoint: one real save stage of the harness model, then its manifest.

Lives in run/ because it launches a torchrun; harness/golden/ only reads and verifies goldens.
"""
from __future__ import annotations

from pathlib import Path

from harness.golden.manifest import GoldenError, write_manifest
from harness.machine import tier_skip_reason
from harness.records import Stage
from harness.tiers import Tier, facts


def make_golden(out: Path | str, *, topology: str, validate_sharding: bool, tier: str = Tier.GPU_SHARED,
         timeout_s: float = 900, notes: str = "") -> Path:
    """Save stage of the harness model at ``topology`` into ``out/ckpt``, then write the manifest.

    GPU host only (tier gpu-shared: TE TEGroupedMLP). The model, seed and calibration are the
    harness defaults (harness.model.gpt / harness.model.quant), so a rerun with the same stack gives the
    same tensors. ``validate_sharding=False`` saves where megatron-core's validation would refuse
    (TP != ETP): the checkpoint then lacks or duplicates some experts' amax (case c).
    """
    from harness.launch.torchrun import run_stage
    from harness.model.gpt import GOLDEN_SIZE
    from harness.rank.spec import StageSpec
    from harness.topology.topology import Topology

    d = Path(out).resolve()
    if (d / "ckpt").exists():
        raise GoldenError(f"{d}/ckpt exists: golden checkpoints are written once")
    topo = Topology.parse(topology)
    why = tier_skip_reason(tier, topo.world_size)  # before any folder: a GPU host's job
    if why:
        raise GoldenError(f"golden make --tier {tier}: {why}; nothing written")
    size = GOLDEN_SIZE.as_dict()
    spec = StageSpec(stage=Stage.SAVE, topology=topo.id, tier=tier,
                     backend=facts(tier).backend, size=size,
                     ckpt_dir=str(d / "ckpt"), reference_dir=str(d / ".work" / "reference"),
                     validate_sharding=validate_sharding)
    spec_path = spec.write(d / ".work" / "spec.json")
    run = run_stage(Stage.SAVE, d / ".work", topo.world_size, [str(spec_path)], timeout_s=timeout_s)
    if not run.ok:
        raise GoldenError(f"save stage failed: {run.summary()}")
    cmd = (f"python -m harness golden make {d.name} --topology {topo.id} "
           f"--validate-sharding {str(validate_sharding).lower()} --tier {tier}")
    return write_manifest(d, topology=topo.id, made_by=cmd, notes=notes, size=size)
