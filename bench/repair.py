"""Time and peak memory of ``inspect`` and ``repair`` at the Nano QAD job's key count.

Synthesizes (harness/golden/synthetic.py) a checkpoint of 23 MoE layers x 128 experts in a temp
dir, in the 0.46-style shared layout and the 0.47 incomplete one (half the experts without a
weight amax), then runs ``python -m harness inspect`` and ``python -m harness repair`` on each as
child processes and prints their wall time and peak RSS (each child's own getrusage at exit).
``--hidden/--ffn`` scale the tensors without changing the key count: peak RSS staying flat while
the checkpoint grows is what "streams tensor by tensor" means. ``--import-floor`` also measures a
child that only imports the stack (the RSS no command can go below).

    .venv/bin/python bench/repair.py [--layers 23 --experts 128 --hidden 16 --ffn 32] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import bounded  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1800


def child(argv: list[str]) -> dict:
    """Run ``argv``; its wall seconds, peak RSS (MiB) and exit code. Killed with its group on timeout."""
    start = time.monotonic()
    done = bounded.run(argv, TIMEOUT_S, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}).raise_if_timed_out()
    out, err = done.stdout, done.stderr
    # the child prints its own peak RSS at exit (_PEAK): RUSAGE_CHILDREN would be the maximum
    # over every child so far, not this one's
    wall = time.monotonic() - start
    peak = None
    for line in err.decode().splitlines():
        if line.startswith("PEAK_RSS_KB "):
            peak = int(line.split()[1]) / 1024
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(peak, 1) if peak else None,
            "rc": done.returncode, "stdout_tail": out.decode()[-400:], "stderr_tail": err.decode()[-400:]}


# Runs the harness CLI in-process and prints the process's peak RSS to stderr at exit.
_PEAK = ("import atexit, resource, sys; "
         "atexit.register(lambda: print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
         "file=sys.stderr)); "
         "from harness.cli import main; sys.argv[0] = 'harness'; rc = main(sys.argv[1:]); sys.exit(rc)")


def harness(*args: str) -> dict:
    return child([sys.executable, "-c", _PEAK, *args])


def synth(out: Path, layers: int, experts: int, hidden: int, ffn: int, layout: str) -> dict:
    code = ("import sys, warnings; warnings.filterwarnings('ignore')\n"
            "import atexit, resource\n"
            "atexit.register(lambda: print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr))\n"
            "from harness.golden.synthetic import synthesize\n"
            "if __name__ == '__main__':\n"
            f"    synthesize({str(out)!r}, layers={layers}, experts={experts}, hidden={hidden}, ffn={ffn}, layout={layout!r})\n")
    return child([sys.executable, "-c", code])


def size_mib(d: Path) -> float:
    return round(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**20, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=23)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=32)
    ap.add_argument("--layouts", default="shared,incomplete")
    ap.add_argument("--import-floor", action="store_true")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        if args.import_floor:
            floor = child([sys.executable, "-c", "import atexit, resource, sys; atexit.register(lambda: "
                           "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)); "
                           "import torch, megatron.core.dist_checkpointing, torch.distributed.checkpoint"])
            rows.append({"step": "import floor (torch + megatron-core)", **floor})
        for layout in args.layouts.split(","):
            src, dst = Path(tmp) / f"{layout}-src", Path(tmp) / f"{layout}-dst"
            s = synth(src, args.layers, args.experts, args.hidden, args.ffn, layout)
            if s["rc"] != 0:
                print(f"synthesis failed: {s['stderr_tail']}", file=sys.stderr)
                return 1
            from torch.distributed.checkpoint import FileSystemReader

            keys = len(FileSystemReader(str(src)).read_metadata().state_dict_metadata)
            rows.append({"step": f"synthesize {layout}", "keys": keys, "ckpt_mib": size_mib(src), **s})
            rows.append({"step": f"inspect {layout}", **harness("inspect", "--json", str(src))})
            rows.append({"step": f"repair {layout}", **harness("repair", str(src), str(dst))})
            if rows[-1]["rc"] != 0:
                print(f"repair failed: {rows[-1]['stderr_tail']}", file=sys.stderr)
                return 1
            rows[-1]["dst_mib"] = size_mib(dst)
            rows.append({"step": f"inspect {layout} repaired", **harness("inspect", "--json", str(dst))})
    print(f"{args.layers} MoE layers x {args.experts} experts, hidden {args.hidden}, expert ffn {args.ffn}; "
          f"{os.cpu_count()} cores")
    print(f"{'step':34} {'wall s':>8} {'peak RSS MiB':>13} {'rc':>3}  notes")
    for r in rows:
        notes = ", ".join(f"{k} {r[k]}" for k in ("keys", "ckpt_mib", "dst_mib") if k in r)
        print(f"{r['step']:34} {r['wall_s']:>8} {r['peak_rss_mib'] or '-':>13} {r['rc']:>3}  {notes}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0 if all(r["rc"] in (0, 1) for r in rows if r["step"].startswith("inspect")) else 1


if __name__ == "__main__":
    sys.exit(main())
