"""``make repro`` of two (or more) versions of the harness, side by side.

    python bench/repro_compare.py LOG [LOG ...]
    python bench/repro_compare.py --run OUT [--results-root DIR]
                                  --side NAME TREE [VAR=VALUE ...] [--side ...]

Each LOG is the output of one ``python -m harness repro`` with a last line ``wall: <s> s``.
``--run`` makes them: one repro per side, one after the other, in TREE (a checkout, or an older
commit unpacked by ``git archive``) with this interpreter and VAR=VALUE added to the
environment, results under DIR/NAME (default OUT/results/NAME), log OUT/repro-NAME.log
(on the GPU host too, from a carried checkout; the cpu recipe in docs/benchmarks.md).
Prints, per side, the
harness clock ("repro finished in N s"), the wall and the results file; per cell, each side's
outcome and stage walls; then whether every side has the same cells with the same outcome,
exception type and failing key. Exit 1 when they differ (or, with ``--run``, when a side's
repro exited non-zero), 2 when a log is unreadable.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import bounded  # noqa: E402

SIDE_TIMEOUT_S = 1800  # one repro; the GPU one takes 60-130 s, the cpu one 40-100 s

SAME = ("outcome", "exception_type", "failing_key")


def side(log: Path) -> dict:
    text = log.read_text(errors="replace")
    clock = re.search(r"^repro finished in (\d+) s", text, re.M)
    wall = re.search(r"^wall: ([\d.]+) s", text, re.M)
    results = re.search(r"^results: (\S+)", text, re.M)
    if not (clock and wall and results and Path(results.group(1)).is_file()):
        raise ValueError(f"{log}: no 'repro finished', 'wall:' or readable 'results:' line")
    doc = json.loads(Path(results.group(1)).read_text())
    return {"name": log.stem.removeprefix("repro-"), "clock": int(clock.group(1)),
            "wall": float(wall.group(1)), "results": results.group(1),
            "cells": {c["cell_id"]: c for c in doc["cells"]}}


def run_side(out: Path, results: Path, name: str, tree: Path, env: dict[str, str]) -> tuple[Path, int]:
    """One ``python -m harness repro`` in ``tree``: its log (``wall:`` line appended) and exit
    code. The repro runs in its own process group, killed whole if it outlives SIDE_TIMEOUT_S."""
    log = out / f"repro-{name}.log"
    cmd = [sys.executable, "-m", "harness", "--results-root", str(results.resolve() / name), "repro"]
    start = time.monotonic()
    with log.open("w") as f:
        done = bounded.run(cmd, SIDE_TIMEOUT_S, cwd=tree, env={**os.environ, **env}, stdout=f,
                           stderr=subprocess.STDOUT)
        wall = time.monotonic() - start
        f.write(f"wall: {wall:.1f} s\n")
    print(f"repro {name}: rc {done.returncode}, {wall:.1f} s, {log}", file=sys.stderr)
    return log, done.returncode


def run_sides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--run OUT --side NAME TREE [VAR=VALUE ...] ...`` -> the logs of the sides it ran, and
    the names of those whose repro exited non-zero."""
    ap = argparse.ArgumentParser(prog="bench/repro_compare.py", usage="%(prog)s --run OUT "
                                 "[--results-root DIR] --side NAME TREE [VAR=VALUE ...] [--side ...]")
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--results-root", type=Path)
    ap.add_argument("--side", nargs="+", action="append", required=True)
    args = ap.parse_args(argv)
    sides = []
    for name, *rest in args.side:
        if not rest or not (Path(rest[0]) / "harness" / "__main__.py").is_file():
            ap.error(f"--side {name}: TREE must be a harness checkout (harness/__main__.py)")
        pairs = [kv.split("=", 1) for kv in rest[1:]]
        if any(len(kv) != 2 for kv in pairs):
            ap.error(f"--side {name}: environment entries read VAR=VALUE")
        sides.append((name, Path(rest[0]), dict(pairs)))
    args.run.mkdir(parents=True, exist_ok=True)
    results = args.results_root or args.run / "results"
    ran = {name: run_side(args.run, results, name, tree, env) for name, tree, env in sides}
    return [str(log) for log, _ in ran.values()], [name for name, (_, rc) in ran.items() if rc]


def main(argv: list[str]) -> int:
    failed: list[str] = []
    if argv[:1] == ["--run"]:
        argv, failed = run_sides(argv)
    rc = compare(argv)
    if failed:
        print(f"repro_compare: repro exited non-zero on {', '.join(failed)} (its log says why)",
              file=sys.stderr)
    return max(rc, 1) if failed else rc


def compare(argv: list[str]) -> int:
    """The side-by-side table of the repro logs ``argv``; 1 when their outcomes differ."""
    try:
        sides = [side(Path(a)) for a in argv]
    except (OSError, ValueError) as exc:
        print(f"repro_compare: {exc}", file=sys.stderr)
        return 2
    if not sides:
        print("usage: python bench/repro_compare.py LOG [LOG ...]", file=sys.stderr)
        return 2
    names = [s["name"] for s in sides]
    print("| | " + " | ".join(names) + " |\n|---|" + "---:|" * len(sides))
    print("| harness clock, s | " + " | ".join(str(s["clock"]) for s in sides) + " |")
    print("| wall, s | " + " | ".join(f"{s['wall']:.1f}" for s in sides) + " |")
    ids = sorted({c for s in sides for c in s["cells"]})
    for cid in ids:
        row = []
        for s in sides:
            c = s["cells"].get(cid)
            d = (c or {}).get("durations", {})
            row.append("-" if c is None else c["outcome"] + " " + "/".join(
                f"{d[k]:.1f}" for k in ("save_stage", "load_stage") if k in d))
        print(f"| {cid} (outcome save/load s) | " + " | ".join(row) + " |")
    for s in sides:
        print(f"results {s['name']}: {s['results']}")
    ref = {cid: tuple(c.get(k) for k in SAME) for cid, c in sides[0]["cells"].items()}
    differ = [s["name"] for s in sides[1:]
              if {cid: tuple(c.get(k) for k in SAME) for cid, c in s["cells"].items()} != ref]
    print(f"same cells, outcomes, exceptions and failing keys as {names[0]}: "
          + ("yes" if not differ else "NO for " + ", ".join(differ)))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
