"""Where a rank's import time goes: ``python -X importtime`` of the stack a stage
imports, summed by top-level package, in a fresh interpreter per repeat.

    python bench/import_profile.py [--repeats 3] [--concurrent 1] [--json FILE]

Also says after each import whether CUDA is initialized (a parent that initialized CUDA
cannot fork ranks). ``--concurrent N`` starts N interpreters at once, as a stage's ranks do.
``--block a,b`` makes importing those top-level packages fail (ModuleNotFoundError, as if not
installed) and names who asked for them: whether the stack still imports without them, and what
trimming them would save. Figures only, no thresholds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What a stage's rank imports, in the order harness/rank/setup.py imports it.
STACK = ["torch", "transformer_engine.pytorch", "megatron.core", "modelopt.torch.quantization",
         "megatron.core.models.gpt", "megatron.core.dist_checkpointing"]
PROBE = """
import importlib, json, os, sys, time
blocked = {b for b in os.environ.get("IMPORT_PROFILE_BLOCK", "").split(",") if b}
asked = {}
class Block:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in blocked:
            return None
        f = sys._getframe(1)
        while f and f.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            f = f.f_back
        asked.setdefault(top, set()).add(f.f_globals.get("__name__", "?") if f else "?")
        raise ModuleNotFoundError(f"blocked by import_profile: {name}", name=name)
sys.meta_path.insert(0, Block())
out = []
for name in sys.argv[1:]:
    t = time.perf_counter()
    try:
        importlib.import_module(name)
        err = None
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"[:200]
    took = time.perf_counter() - t
    torch = sys.modules.get("torch")
    cuda = bool(torch and torch.cuda.is_available() and torch.cuda.is_initialized())
    out.append({"module": name, "seconds": round(took, 3), "cuda_initialized": cuda, "error": err})
print("PROFILE " + json.dumps({"steps": out, "blocked_asked_by": {k: sorted(v) for k, v in asked.items()}}))
"""
_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")


def one(stack: list[str], block: str = "") -> tuple[list[dict], dict[str, float], dict]:
    """One fresh interpreter: per-module wall and CUDA state, self time by top package, and
    who asked for a blocked package."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "IMPORT_PROFILE_BLOCK": block}
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE, *stack], env=env,
                       capture_output=True, text=True, timeout=600)
    doc = next((json.loads(l[8:]) for l in p.stdout.splitlines() if l.startswith("PROFILE ")), None)
    if doc is None:
        raise SystemExit(f"profile interpreter failed (rc {p.returncode}): {p.stderr[-2000:]}")
    steps = doc["steps"]
    by_package: dict[str, float] = defaultdict(float)
    for line in p.stderr.splitlines():
        m = _LINE.match(line)
        if m:
            by_package[m.group(4).split(".")[0]] += int(m.group(1)) / 1e6  # self time, seconds
    return steps, dict(by_package), doc["blocked_asked_by"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--stack", nargs="*", default=STACK)
    ap.add_argument("--block", default="", help="comma-separated top-level packages to refuse")
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        if args.concurrent == 1:
            runs.append(one(args.stack, args.block))
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(args.concurrent) as pool:
                runs += list(pool.map(lambda _: one(args.stack, args.block), range(args.concurrent)))
        print(f"# repeat wall {time.perf_counter() - t:.2f} s ({args.concurrent} interpreter(s) at once)")
    print(f"\nper module, in import order (seconds over {len(runs)} interpreters: median / max)")
    for i, name in enumerate(args.stack):
        secs = [r[0][i]["seconds"] for r in runs]
        cuda = {r[0][i]["cuda_initialized"] for r in runs}
        err = next((r[0][i]["error"] for r in runs if r[0][i]["error"]), None)
        print(f"  {name:36} {statistics.median(secs):7.2f} {max(secs):7.2f}   "
              f"cuda initialized after: {sorted(cuda)}" + (f"   ERROR {err}" if err else ""))
    asked = defaultdict(set)
    for *_, by in runs:
        for k, v in by.items():
            asked[k].update(v)
    if args.block:
        print(f"\nblocked {args.block}: asked for by " + (
            "; ".join(f"{k} <- {', '.join(sorted(v))}" for k, v in sorted(asked.items())) or "nobody"))
    totals = defaultdict(list)
    for _, pk, _ in runs:
        for k, v in pk.items():
            totals[k].append(v)
    top = sorted(totals, key=lambda k: -statistics.median(totals[k]))[:15]
    print("\nself time by top-level package (python -X importtime, seconds, median)")
    for k in top:
        print(f"  {k:36} {statistics.median(totals[k]):7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"stack": args.stack, "concurrent": args.concurrent,
                                         "block": args.block,
                                         "blocked_asked_by": {k: sorted(v) for k, v in asked.items()},
                                         "runs": [{"steps": s, "by_package": p} for s, p, _ in runs]},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
