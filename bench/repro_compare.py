"""``make repro`` of two (or more) versions of the harness, side by side (issue 23).

    python bench/repro_compare.py LOG [LOG ...]

Each LOG is the output of one ``python -m harness repro`` with a last line ``wall: <s> s``
appended by its caller (tools/gpu-host/run.sh repro-compare). Prints, per side, the harness
clock ("repro finished in N s"), the wall and the results file; per cell, each side's outcome
and stage walls; then whether every side has the same cells with the same outcome, exception
type and failing key. Exit 1 when they differ, 2 when a log is unreadable.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

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


def main(argv: list[str]) -> int:
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
