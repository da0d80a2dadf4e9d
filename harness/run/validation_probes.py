"""Controller side of the probes of megatron-core's REAL sharding validation: a probe spec
handed to gloo ranks running harness/rank/validation_probes.py (no model), and the oracle's
cross-check over every topology of one world size (``make repro`` on cpu,
tests/test_oracle_vs_megatron.py)."""
from __future__ import annotations

import json
from pathlib import Path

from harness.launch.stages import run_module_stage


def run_probe(probe: dict, nproc: int, stage_dir: Path, timeout_s: float = 240,
              root: Path | None = None):
    """Start ``harness.rank.validation_probes`` on ``nproc`` gloo ranks, as the cpu tier starts
    its stages (it needs only torch and megatron-core imported); ``root``: the run directory
    (launch/stages.py ``run_module_stage``). Returns the launcher's StageRun."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    spec = stage_dir / "probe.json"
    spec.write_text(json.dumps(probe))
    return run_module_stage(f"probe-{probe['probe']}", stage_dir, nproc, [str(spec)], timeout_s,
                            "harness.rank.validation_probes", root=root)


def probe_oracle_world(topologies, world: int, num_experts: int, stage_dir: Path,
                       chunk: int = 16, root: Path | None = None) -> dict:
    """Real megatron-core validation of the per-expert amax rule for topologies of one world.

    Every topology builds all of megatron's process groups anew and torch keeps the old ones
    alive, so one torchrun handles at most ``chunk`` topologies (seen: 49 topologies on 6 gloo
    ranks stalled in group creation).
    """
    results: dict = {}
    for n in range(0, len(topologies), chunk):
        part = topologies[n:n + chunk]
        run = run_probe({"probe": "oracle", "topologies": [t.id for t in part],
                         "num_experts": num_experts}, world, stage_dir / f"chunk{n // chunk}",
                        timeout_s=120 + 10 * len(part), root=root)
        if not run.ok:
            raise RuntimeError(f"oracle probe on {world} ranks failed: {run.summary()}")
        results.update(run.rank_results[0]["results"])
    return results
