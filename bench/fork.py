"""Fresh torchrun vs warm pool vs ranks forked from a warm parent, in one run.

    python bench/fork.py [--scenario cpu-reshard] [--cells 3] [--modes fresh,pool,fork]

Runs the save-only cell(s) and the first ``--cells`` load cells of ``--scenario`` through the
real controller (run_cells) once per stage mode, one mode after the other on the same machine,
and prints per stage: ``start`` (the controller started the stage -> rank 0's clock started:
its first line of stage code; a stage that waited for a new pool or warm parent includes that
wait and its imports), ``imports`` (rank 0 importing the stack in the stage: about 0 when the
ranks start warm) and the stage wall; then the memory of each mode, sampled every
``--sample-s`` seconds with psutil over every process of the run: the launcher (torchrun, the
pool's torchrun, or the warm parent), the stage agents (fork), each rank (peak RSS, USS and
PSS: USS is what only that process holds, PSS splits shared pages among their sharers, so
copy-on-write sharing with the warm parent shows as PSS well below RSS), and the peak of the
summed PSS of all of them (the run's real footprint). Figures only, no thresholds; a cell that
does not pass stops the bench.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pool import cells  # noqa: E402
from harness.records import Outcome, Stage  # noqa: E402
from harness.scenario.selections import bench_choice  # noqa: E402

MIB = 1024 * 1024
# depth below the controller -> role, per mode (a rank's helpers, e.g. the torch_dist save's
# spawn Manager, are named by their command line)
ROLES = {"fresh": {1: "launcher", 2: "rank"}, "pool": {1: "launcher", 2: "rank"},
         "fork": {1: "launcher", 2: "agent", 3: "rank"}}


class Sampler:
    """Peak RSS/USS/PSS per process of the run under ``root``, and the peak summed PSS."""

    def __init__(self, root: Path, mode: str, every_s: float):
        self.root, self.mode, self.every_s = str(root), mode, every_s
        self.peaks: dict[int, dict] = {}
        self.total_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _role(self, p: psutil.Process) -> str | None:
        depth, q, me = 0, p, os.getpid()
        while q is not None and q.pid != me and depth < 8:
            q, depth = q.parent(), depth + 1
        if q is None or q.pid != me:
            return None
        if any("multiprocessing" in a for a in p.cmdline()):
            return "helper"
        return ROLES[self.mode].get(depth, "helper")

    def _loop(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in psutil.process_iter(["pid"]):
                try:
                    env = p.environ()
                    if self.root not in env.get("HARNESS_STAGE_DIR", "") + env.get("HARNESS_POOL_DIR", ""):
                        continue
                    role = self._role(p)
                    m = p.memory_full_info()
                except (psutil.Error, OSError):
                    continue
                if role is None:
                    continue
                total += m.pss
                peak = self.peaks.setdefault(p.pid, {"role": role, "rss": 0, "uss": 0, "pss": 0})
                for k in ("rss", "uss", "pss"):
                    peak[k] = max(peak[k], getattr(m, k))
            self.total_pss = max(self.total_pss, total)
            self._stop.wait(self.every_s)

    def rows(self) -> dict[str, str]:
        out = {}
        for role in ("launcher", "agent", "rank", "helper"):
            got = [v for v in self.peaks.values() if v["role"] == role]
            if got:
                out[f"{role}: peak RSS / USS / PSS MiB, max over processes (how many)"] = " / ".join(
                    f"{max(v[k] for v in got) / MIB:.0f}" for k in ("rss", "uss", "pss")) + f" ({len(got)})"
        ranks = [v for v in self.peaks.values() if v["role"] == "rank"]
        if ranks:
            out["ranks' peak RSS summed MiB"] = f"{sum(v['rss'] for v in ranks) / MIB:.0f}"
        out["peak PSS of every process summed MiB"] = f"{self.total_pss / MIB:.0f}"
        return out


def one_run(chosen: list, mode: str, root: Path, every_s: float) -> tuple[dict, dict, float]:
    """({stage row: (start, imports, wall)}, {memory row: text}, run wall) of one run in ``mode``."""
    from harness.launch.pool import POOLS
    from harness.launch.warm import WARM
    from harness.run.cells import run_cells

    os.environ["HARNESS_STAGE_MODE"] = mode
    POOLS.close_all()
    WARM.close_all()
    t = time.monotonic()
    with Sampler(root / mode, mode, every_s) as sampler, open(os.devnull, "w") as quiet:
        doc = run_cells(chosen, root / mode, mode, jobs=1, out=quiet)
    wall = time.monotonic() - t
    stages = {}
    for c in doc["cells"]:
        if c["outcome"] != Outcome.PASS:
            raise SystemExit(f"{mode}: {c['cell_id']} {c['outcome']}: {(c['message'] or '')[:300]}")
        d = c["durations"]
        which = Stage.LOAD if c["load_topology"] else Stage.SAVE
        name = f"{which} {c['load_topology'] or c['save_topology']}"
        if f"{which}_stage" in d:
            stages[name] = (d.get(f"{which}.start"), d.get(f"{which}.imports"), d[f"{which}_stage"])
    return stages, sampler.rows(), wall


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenario", default=bench_choice("pool"))
    p.add_argument("--cells", type=int, default=3, help="load cells of the scenario (plus its saves)")
    p.add_argument("--modes", default="fresh,pool,fork")
    p.add_argument("--sample-s", type=float, default=0.5, help="memory sampling period")
    args = p.parse_args()
    modes = args.modes.split(",")
    chosen = cells(args.scenario, args.cells)
    stages, memory, walls = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            stages[mode], memory[mode], walls[mode] = one_run(chosen, mode, Path(tmp), args.sample_s)
            print(f"# {mode}: run {walls[mode]:.1f} s", flush=True)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    print(f"\n{args.scenario}, {len(chosen)} cells, one run per mode, in this order: "
          f"{', '.join(modes)}; seconds, start / imports / stage wall")
    print("| stage | " + " | ".join(modes) + " |")
    print("| --- |" + " ---: |" * len(modes))
    for row in stages[modes[0]]:
        cols = [" / ".join(fmt(v) for v in stages[m].get(row, (None, None, None))) for m in modes]
        print(f"| {row} | " + " | ".join(cols) + " |")
    print("| run (every stage, pools and parents closed) | " + " | ".join(f"{walls[m]:.2f}" for m in modes) + " |")
    print("\nmemory, peak over the run")
    print("| | " + " | ".join(modes) + " |")
    print("| --- |" + " ---: |" * len(modes))
    rows = list(dict.fromkeys(r for m in modes for r in memory[m]))
    for row in rows:
        print(f"| {row} | " + " | ".join(memory[m].get(row, "-") for m in modes) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
