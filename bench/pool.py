"""Fresh torchrun per stage (the reference) against warm rank pools, side by side (issue 14).

    python bench/pool.py [--cells 3] [--repeats 2] [--jobs 1] [--repro]

Runs the save-only cell and the first ``--cells`` load cells of scenario cpu-reshard through
the real controller (run_cells) in both stage modes, interleaved (fresh, pool, pool, fresh, ...)
so drift on a busy machine hits both; prints the median wall time per stage, per cell (its
save stage plus its load stage) and per run, and pool/fresh as a ratio. Figures only, no
thresholds; a cell that does not pass in either mode stops the bench. ``--jobs N`` runs N
cells of a phase at once (then two loads of one world size can want the same warm pool, and
the pool mode's torchrun starts are printed too). ``--repro`` also times
``python -m harness repro`` (what ``make repro`` runs) in both modes, in a subprocess each.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODES = ("fresh", "pool")


def cells(n: int) -> list:
    from harness.run.cells import select_cells
    from harness.scenario.scenarios import load_all

    every = select_cells([s for s in load_all() if s.name == "cpu-reshard"])
    loads = [c for c in every if c.load is not None][:n]
    return select_cells([s for s in load_all() if s.name == "cpu-reshard"], [c.id for c in loads])


def one_run(chosen: list, mode: str, root: Path, jobs: int = 1) -> dict:
    """{row: seconds} for one run in ``mode``."""
    from harness.launch.pool import POOLS
    from harness.run.cells import run_cells

    os.environ["HARNESS_STAGE_MODE"] = mode
    t, started, waited = time.monotonic(), POOLS.started, POOLS.waited
    with open(os.devnull, "w") as quiet:
        doc = run_cells(chosen, root / mode, mode, jobs=jobs, out=quiet)
    rows = {"run (every stage, pools closed)": time.monotonic() - t}
    if mode == "pool":
        print(f"# pool run: {POOLS.started - started} torchrun starts, "
              f"{POOLS.waited - waited} stages waited for a warm pool", flush=True)
    for c in doc["cells"]:
        if c["outcome"] != "pass":
            raise SystemExit(f"{mode}: {c['cell_id']} {c['outcome']}: {c['message']}")
        d = c["durations"]
        rows[f"stage save {c['save_topology']}"] = d["save_stage"]
        if c["load_topology"]:
            rows[f"stage load {c['load_topology']}"] = d["load_stage"]
            rows[f"cell  {c['load_topology']}"] = d["save_stage"] + d["load_stage"]
    return rows


REPRO_TIMEOUT_S = 1800


def repro(mode: str, root: Path) -> float:
    """Wall seconds of ``python -m harness repro`` in ``mode`` (killed with its group on timeout)."""
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "HARNESS_STAGE_MODE": mode}
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--results-root", str(root / mode),
                             "repro"], cwd=repo, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout=REPRO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise SystemExit(f"{mode}: repro still running after {REPRO_TIMEOUT_S} s; killed")
    if rc != 0:
        raise SystemExit(f"{mode}: repro exited {rc}")
    return time.monotonic() - t


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cells", type=int, default=3, help="load cells of cpu-reshard (plus the save)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--jobs", type=int, default=1, help="cells of a phase at once")
    p.add_argument("--repro", action="store_true", help="also time `python -m harness repro`")
    args = p.parse_args()
    chosen = cells(args.cells)
    got: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                for row, s in one_run(chosen, mode, Path(tmp) / str(i), args.jobs).items():
                    got[mode].setdefault(row, []).append(s)
                if args.repro:
                    got[mode].setdefault("make repro", []).append(repro(mode, Path(tmp) / f"r{i}"))
    print(f"cpu-reshard, {len(chosen)} cells, {args.repeats} interleaved repeats; median seconds")
    print(f"  {'':42} {'fresh':>8} {'pool':>8} {'pool/fresh':>10}")
    for row in sorted(got["fresh"], key=lambda r: (r.startswith(("run", "make")), r.startswith("cell"), r)):
        f, q = statistics.median(got["fresh"][row]), statistics.median(got["pool"][row])
        print(f"  {row:42} {f:8.2f} {q:8.2f} {q / f:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
