"""``make repro``: show the bug and the fix on the best tier this machine has, within minutes.

cpu (no GPU or no TE): the collision map, the real megatron-core validation reproducing the
report's exception on gloo ranks (judged and kept in the run's results.json as its witness, so
summary.md and grid.png show it), and the cpu-tier reshard grid. GPU host (TE + CUDA): the
witness and the fix at the report's topology (tp4-etp1-ep8) on tier gpu-shared.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from harness.launch.signals import shutdown_signal
from harness.paths import RunDir
from harness.records import UNEXPECTED_OUTCOMES
from harness.run.results import collect, exit_code
from harness.scenario import selections
from harness.machine import tier_skip_reason, versions
from harness.tiers import Tier
from moe_ckpt_fix.releases import LAST_BUGGY
from harness.topology.topology import Topology

VALIDATION_SHOWCASE = ["tp2-etp1-ep2", "tp1-etp2-ep1", "tp2-etp1-ep1", "tp1-etp1-ep2"]
PROBE_WORLD = 2
GPU_REPRO_CELLS = list(selections.listed("repro", "gpu_host"))  # scenarios/selections.toml
CPU_REPRO_CELLS = list(selections.listed("repro", "cpu_only"))


def _header(tier: str, why: str) -> None:
    v = versions()
    print(f"== moe-ckpt-harness repro: tier {tier} ({why})")
    print("   " + ", ".join(f"{k} {v[k]}" for k in ("torch", "megatron-core", "nvidia-modelopt",
                                                      "transformer-engine", "gpu")))


def _show_map() -> None:
    from harness.topology.collision_map import summary
    from harness.topology.oracle import collision_map

    s = summary(collision_map(8))
    print(f"\n== collision map (oracle), every (tp, etp, ep, pp) up to 8 ranks: "
          f"{s['topologies']} topologies, {s['buggy_fail']} fail under modelopt 0.47.0's rule, "
          f"{s['fixed_fail']} under the fix  (details: python -m harness map)")


def _show_real_validation(run: RunDir) -> bool | None:
    """megatron-core's real validation on gloo ranks, judged per topology and rule and written
    into the run (its probes.json: results.json, summary.md and grid.png show the witness).
    Whether the oracle agrees with it; None when a signal stopped the probe."""
    from harness.check.probes import judge_probe
    from harness.records import ProbeRule
    from harness.report.summary import probe_cause
    from harness.run.results import write_probes
    from harness.run.validation_probes import probe_oracle_world

    topos = [Topology.parse(t) for t in VALIDATION_SHOWCASE]
    print(f"\n== megatron-core validate_sharding_integrity, real, on {PROBE_WORLD} gloo ranks "
          "(per-expert amax built as modelopt 0.47.0 does / as the fix does)")
    try:
        real = probe_oracle_world(topos, PROBE_WORLD, 8, run.probe(f"oracle-w{PROBE_WORLD}"),
                                  root=run.root)
    except RuntimeError as exc:  # the probe failed or was stopped: one line, not a traceback
        if shutdown_signal():
            return None
        print(f"   error: {exc}")
        return False
    records = [judge_probe(t.id, rule, PROBE_WORLD, real[t.id][rule])
               for t in topos for rule in (ProbeRule.BUGGY, ProbeRule.FIXED)]
    write_probes(records, run)
    for r in records:
        first = r.rule == ProbeRule.BUGGY
        print(f"   {r.topology if first else '':18} {LAST_BUGGY if first else 'fixed ':6}: "
              f"{r.outcome}: {probe_cause(r)}")
    agree = not any(r.outcome in UNEXPECTED_OUTCOMES for r in records)
    print(f"   oracle agrees with the real validation on all {len(topos)} topologies: {agree}")
    return agree


def _looks_like_gpu_host() -> bool:
    """A guess that costs nothing (no torch, no TE import): an NVIDIA device node and a TE
    package. Only decides whether to start the save pools early; tier_skip_reason decides."""
    import importlib.util

    gpus = Path("/proc/driver/nvidia/gpus")
    return importlib.util.find_spec("transformer_engine") is not None and (
        any(Path("/dev").glob("nvidia[0-9]*")) or (gpus.is_dir() and any(gpus.iterdir())))


def _start_save_pools_early(cells, results_root: Path) -> RunDir | None:
    """Warm pools only: the GPU run's save pools, started before the controller imports torch
    and TE for its own checks (about 11 s on the H200 host), so those checks overlap
    the ranks' start and imports instead of preceding them. Returns the run directory."""
    from harness.run.cells import prestart_save_pools

    run = RunDir.new(results_root, "repro-gpu")
    started = prestart_save_pools(cells, run)
    if started:
        print(f"== {started} save-stage pools started ahead of the checks (warm rank pools)")
        return run
    run.root.rmdir()
    return None


def _keep_rank_env(before: dict[str, str]) -> None:
    """The controller's own torch/TE imports may set variables a pool's key holds (CUDA_*,
    TORCH_*); the early pools' ranks started without them. Put them back as they were, so
    the stages' keys match those pools and every rank starts from the same environment."""
    import os

    from harness.launch.pool import key_environment

    now = key_environment()
    changed = sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
    for k in changed:
        if k in before:
            os.environ[k] = before[k]
        else:
            os.environ.pop(k)
    if changed:
        print(f"   (variables set by the controller's own imports, kept from the ranks: "
              f"{', '.join(changed)})")


def _drop_early_run(run: RunDir | None) -> None:
    """Not a GPU run after all: close the pools started early and remove their run directory."""
    import shutil

    from harness.launch.pool import POOLS

    if run is not None:
        POOLS.close_all()
        shutil.rmtree(run.root, ignore_errors=True)


def repro(results_root: Path, gpu: str = "auto") -> int:
    from harness.launch.pool import key_environment
    from harness.run.cells import prestart_warm_parents, run_cells, select_cells
    from harness.scenario.scenarios import load_all

    start = time.monotonic()
    scenarios = load_all()
    gpu_cells = select_cells(scenarios, GPU_REPRO_CELLS)
    rank_env = key_environment()
    early = (_start_save_pools_early(gpu_cells, results_root)
             if gpu != "no" and _looks_like_gpu_host() else None)
    gpu_reason = tier_skip_reason(Tier.GPU_SHARED, 8)
    use_gpu = gpu == "yes" or (gpu == "auto" and gpu_reason is None)
    if gpu == "yes" and gpu_reason:
        _drop_early_run(early)
        print(f"error: --gpu yes but {gpu_reason}", file=sys.stderr)
        return 2
    ok: bool | None = True  # the cpu tier's probe: the oracle agrees with the real validation
    if use_gpu:
        _header(Tier.GPU_SHARED, "CUDA GPU and Transformer Engine found")
        if early is not None:
            _keep_rank_env(rank_env)
        doc = run_cells(gpu_cells, results_root, "repro-gpu", jobs=4, run_dir=early)
    else:
        _drop_early_run(early)
        _header(Tier.CPU, gpu_reason or "forced with --gpu no")
        print("   GPU tiers (gpu-shared, gpu) need a CUDA GPU + Transformer Engine; "
              "run `make repro` on a GPU host or in the docker image for the TEGroupedMLP path.")
        run = RunDir.new(results_root, "repro-cpu")
        cpu_cells = select_cells(scenarios, CPU_REPRO_CELLS)
        prestart_warm_parents(cpu_cells, run)  # its imports overlap the map and the probe
        _show_map()
        ok = _show_real_validation(run)
        if ok is None:  # stopped during the probe: its results file, marked as every phase's is
            doc = collect(run, versions(), tier=Tier.CPU, interrupted=shutdown_signal())
            print(f"results: {run.results}")
        else:
            print("\n== cpu tier reshard grid (real megatron-core + ModelOpt NVFP4, SequentialMLP, gloo)")
            doc = run_cells(cpu_cells, results_root, "repro-cpu", jobs=1, run_dir=run)
    if doc.get("incomplete"):
        print(f"\nrepro interrupted ({doc['interrupted_by']}) after {time.monotonic() - start:.0f} s")
        return exit_code(doc)
    if not ok:
        return 1
    _what_it_means(doc, results_root, use_gpu)
    print(f"\nrepro finished in {time.monotonic() - start:.0f} s")
    return exit_code(doc)


def _what_it_means(doc: dict, results_root: Path, on_gpu: bool) -> None:
    """The run's picture and report written, then what the evidence says and what to do next."""
    from harness.fix import JOB_CHANGE
    from harness.report.picture import write_report
    from harness.report.summary import witness_lines, witnesses

    run = RunDir(results_root / doc["run_id"])
    try:
        write_report(run.results)
        picture = f"{run.grid} (report: {run.summary})"
    except Exception as exc:  # noqa: BLE001  (the picture must not hide the evidence)
        picture = f"not written ({type(exc).__name__}: {exc})"
    found = witnesses(doc)
    print("\n== what this means")
    if found:
        print(f"   the collision reproduced ({len(found)} witness(es)); the first:")
        print("\n".join(f"     {line}" for line in witness_lines(found[0])))
    else:
        print("   the collision did not reproduce in this run")
    if not on_gpu:
        print("   the cpu grid reshards at TP = ETP = 1 (SequentialMLP) and passes: the collision "
              "needs TP != ETP, which the real validation above shows")
    print(f"   picture: {picture}")
    print("   next steps:")
    print("   - is your job safe on a release: python -m harness verdict --job <id> --gate "
          "--modelopt V --mcore M [--patched]  (the committed GPU records of that pair; your own: "
          "--results <results.json>; job profiles: scenarios/quarantine.toml; README 'The verdict')")
    print(f"   - the fix for nvidia-modelopt 0.47.0, with no code change: make fix-wheel, then in "
          f"the job {JOB_CHANGE} (README 'Using the fix')")
    print("   - your own checkpoint: python -m harness inspect <ckpt>  (layout, amax kind, what "
          "each (modelopt, megatron-core) pair does with it); python -m harness repair SRC DST")
