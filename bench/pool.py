"""Fresh torchrun per stage (the reference) against warm rank pools, side by side.

    python bench/pool.py [--scenario cpu-reshard] [--cells 3] [--repeats 2] [--jobs 1] [--repro]
    python bench/pool.py --recorded FRESH/results.json POOL/results.json

Runs the save-only cell(s) and the first ``--cells`` load cells of ``--scenario`` (default
cpu-reshard; a gpu-shared scenario on a GPU host) through the real controller (run_cells) in
both stage modes, interleaved (fresh, pool, pool, fresh, ...) so drift on a busy machine hits
both; prints the median wall time per stage, per cell (its save stage plus its load stage) and
per run, and pool/fresh as a ratio. Figures only, no thresholds; a cell that does not pass in
either mode stops the bench. ``--jobs N`` runs N cells of a phase at once (then two loads of
one world size can want the same warm pool, and the pool mode's torchrun starts are printed
too). ``--repro`` also times ``python -m harness repro`` (what ``make repro`` runs) in both
modes, in a subprocess each. ``--recorded`` prints the same table from two results files of
the same cells run back to back (e.g. ``tools/gpu-host/run.sh equivalence`` on the H200).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import bounded  # noqa: E402
from harness.records import Outcome  # noqa: E402
from harness.scenario.selections import bench_choice  # noqa: E402

MODES = ("fresh", "pool")  # fork mode too: bench/fork.py


def cells(scenario: str, n: int) -> list:
    from harness.run.cells import select_cells
    from harness.scenario.scenarios import load_all

    chosen = [s for s in load_all() if s.name == scenario]
    if not chosen:
        raise SystemExit(f"bench/pool.py: no scenario {scenario!r} in scenarios/*.toml")
    loads = [c for c in select_cells(chosen) if c.load is not None][:n]
    return select_cells(chosen, [c.id for c in loads])


def one_run(chosen: list, mode: str, root: Path, jobs: int = 1) -> dict:
    """{row: seconds} for one run in ``mode``."""
    from harness.launch.pool import POOLS
    from harness.run.cells import run_cells

    os.environ["HARNESS_STAGE_MODE"] = mode
    t, started, waited = time.monotonic(), POOLS.started, POOLS.waited
    with open(os.devnull, "w") as quiet:
        doc = run_cells(chosen, root / mode, mode, jobs=jobs, out=quiet)
    wall = time.monotonic() - t
    if mode == "pool":
        print(f"# pool run: {POOLS.started - started} torchrun starts, "
              f"{POOLS.waited - waited} stages waited for a warm pool", flush=True)
    return {"run (every stage, pools closed)": wall, **stage_rows(doc, mode)}


def stage_rows(doc: dict, mode: str, must_pass: bool = True) -> dict:
    """{row: seconds} per stage and per cell of one results doc. ``must_pass``: a cell that did
    not pass stops the bench; else (recorded runs) every stage that ran is a row."""
    rows = {}
    for c in doc["cells"]:
        if must_pass and c["outcome"] != Outcome.PASS:
            raise SystemExit(f"{mode}: {c['cell_id']} {c['outcome']}: {(c['message'] or '')[:300]}")
        d, save, load = c["durations"], f"{c['scenario']} {c['save_topology']}", c["load_topology"]
        if "save_stage" in d:  # a golden cell has none
            rows[f"stage save {save}"] = d["save_stage"]
        if load and "load_stage" in d:
            rows[f"stage load {save} -> {load}"] = d["load_stage"]
            rows[f"cell  {save} -> {load}"] = d.get("save_stage", 0) + d["load_stage"]
    return rows


def print_table(title: str, got: dict[str, dict[str, list[float]]]) -> None:
    print(title)
    print(f"  {'':66} {'fresh':>8} {'pool':>8} {'pool/fresh':>10}")
    both = [r for r in got["fresh"] if r in got["pool"]]
    for row in sorted(both, key=lambda r: (r.startswith(("run", "make")), r.startswith("cell"), r)):
        f, q = statistics.median(got["fresh"][row]), statistics.median(got["pool"][row])
        print(f"  {row:66} {f:8.2f} {q:8.2f} {q / f:10.2f}")


REPRO_TIMEOUT_S = 1800


def repro(mode: str, root: Path) -> float:
    """Wall seconds of ``python -m harness repro`` in ``mode`` (killed with its group on timeout)."""
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "HARNESS_STAGE_MODE": mode}
    t = time.monotonic()
    done = bounded.run([sys.executable, "-m", "harness", "--results-root", str(root / mode),
                        "repro"], REPRO_TIMEOUT_S, cwd=repo, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.STDOUT)
    if done.timed_out:
        raise SystemExit(f"{mode}: repro still running after {REPRO_TIMEOUT_S} s; killed")
    if done.returncode != 0:
        raise SystemExit(f"{mode}: repro exited {done.returncode}")
    return time.monotonic() - t


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenario", default=bench_choice("pool"))
    p.add_argument("--cells", type=int, default=3, help="load cells of the scenario (plus its saves)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--jobs", type=int, default=1, help="cells of a phase at once")
    p.add_argument("--repro", action="store_true", help="also time `python -m harness repro`")
    p.add_argument("--recorded", nargs=2, metavar=("FRESH", "POOL"),
                   help="two results.json of the same cells, fresh then pool: print their table")
    args = p.parse_args()
    if args.recorded:
        return recorded(*args.recorded)
    chosen = cells(args.scenario, args.cells)
    got: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                for row, s in one_run(chosen, mode, Path(tmp) / str(i), args.jobs).items():
                    got[mode].setdefault(row, []).append(s)
                if args.repro:
                    got[mode].setdefault("make repro", []).append(repro(mode, Path(tmp) / f"r{i}"))
    print_table(f"{args.scenario}, {len(chosen)} cells, {args.repeats} interleaved repeats; "
                "median seconds", got)
    return 0


def recorded(fresh: str, pool: str) -> int:
    """The table of two recorded runs (one repeat each): stages and cells only, a results file
    holds no run wall time."""
    from harness.check.results_file import ResultsFileError, read_results

    try:
        docs = {"fresh": read_results(fresh), "pool": read_results(pool)}
    except ResultsFileError as exc:
        raise SystemExit(f"bench/pool.py: {exc}") from None
    got = {m: {r: [s] for r, s in stage_rows(d, m, must_pass=False).items()} for m, d in docs.items()}
    print_table(f"recorded: {docs['fresh']['run_id']} (fresh) vs {docs['pool']['run_id']} (pool), "
                f"tier {docs['fresh'].get('tier')}; seconds", got)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
