"""Teardown latency and attribution accuracy: guarded ranks vs plain torchrun.

Injects each failure kind ``--count`` times into the tiny gloo rank program and prints, per kind
and mode, first-failure -> all-gone latency (median, max) and how often the cause was the
injected rank. "plain" runs the same program without rank_guard (``--no-guard``): torchrun's
own teardown, attributed by its "Root Cause" block, which is what the guard replaces.
``--nccl-shared-gpu``: the same on NCCL (CUDA tensors, every rank on GPU 0 with its own NCCL
host id, harness/rank/shared_gpu.py; GPU host only, kinds raise, sigkill, hang), and afterwards
the GPU's compute processes as nvidia-smi lists them (none of ours may be left).
Figures only, no timed asserts.
"""
from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from harness.launch.torchrun import run_stage

PROGRAM = "tests.rank_programs.collectives"
ROOT_RANK = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:.*?rank\s*:\s*(\d+)", re.S)


def nccl_shared_env() -> dict:
    """The stage environment of tier gpu's shared-GPU mode, for the collectives program."""
    from harness.rank.guard import nccl_env
    from harness.rank.shared_gpu import SHARED_GPU_ENV

    return {**nccl_env(), SHARED_GPU_ENV: "1", "HARNESS_COLLECTIVES_BACKEND": "nccl"}


def one(tmp: Path, kind: str, k: int, nproc: int, guard: bool, pg_timeout: float,
        env: dict | None = None, stage_timeout: float = 120.0) -> tuple[float | None, bool, bool]:
    """(teardown seconds, attributed right, leftovers) for one injected run."""
    r = run_stage("bench", tmp, nproc, [] if guard else ["--no-guard"], stage_timeout,
                  env={**(env or {}), "HARNESS_INJECT": f"{kind}:{k}:before_save"},
                  rank_module=PROGRAM, pg_timeout_s=pg_timeout)
    if guard:
        right = r.cause is not None and r.cause.rank == k
        if kind == "mismatch":  # a peer detecting the odd message is the honest answer on gloo
            right = r.cause is not None and not r.cause.secondary
        return r.teardown_s, right, bool(r.leftovers)
    log = (tmp / "torchrun.log").read_text(errors="replace")
    m = ROOT_RANK.search(log)
    right = bool(m) and int(m.group(1)) == k
    # plain: no error files; first failure is the first rank death the controller saw
    return r.teardown_s, right, bool(r.leftovers)


def _row(kind: str, mode: str, lat: list, right: int, orphans: int, count: int) -> str:
    m = statistics.median(lat) if lat else float("nan")
    mx = max(lat) if lat else float("nan")
    return f"{kind:9} {mode:6} {len(lat):>3} {m:>9.2f} {mx:>7.2f} {right:>3}/{count:<2} {orphans:>7}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--kinds", default=",".join(("raise", "sigkill", "hang", "mismatch")))
    ap.add_argument("--pg-timeout", type=float, default=6.0)
    ap.add_argument("--stage-timeout", type=float, default=120.0,
                    help="below --pg-timeout, a hang is found by the stage timeout (stack dumps, "
                         "then teardown) instead of by the peers' collective timeout")
    ap.add_argument("--nccl-shared-gpu", action="store_true",
                    help="NCCL ranks sharing GPU 0, each its own host (GPU host only)")
    a = ap.parse_args()
    env = nccl_shared_env() if a.nccl_shared_gpu else None
    print(f"backend: {'nccl, ' + str(a.nproc) + ' ranks on one GPU' if env else 'gloo'}")
    rows = []
    header = f"{'kind':9} {'mode':6} {'n':>3} {'median s':>9} {'max s':>7} {'right':>6} {'orphans':>7}"
    print(header, flush=True)  # each row as it is done: a bound that cuts the bench keeps them
    with tempfile.TemporaryDirectory() as td:
        for kind in a.kinds.split(","):
            for guard in (True, False):
                lat, right, orphans = [], 0, 0
                for i in range(a.count):
                    k = (i % (a.nproc - 1)) + 1 if i % 2 else 0
                    t, ok, left = one(Path(td) / f"{kind}-{guard}-{i}", kind, k, a.nproc, guard,
                                      a.pg_timeout, env, a.stage_timeout)
                    lat += [t] if t is not None else []
                    right += ok
                    orphans += left
                rows.append((kind, "guard" if guard else "plain", lat, right, orphans))
                print(_row(*rows[-1], a.count), flush=True)
    med = {(kind, mode): statistics.median(lat) if lat else float("nan")
           for kind, mode, lat, _, _ in rows}
    for kind in a.kinds.split(","):
        g, p = med[(kind, "guard")], med[(kind, "plain")]
        print(f"{kind}: plain/guard median teardown ratio = {p / g:.2f}" if g else f"{kind}: n/a")
    if env:
        print("GPU compute processes after:", gpu_processes() or "(nvidia-smi lists none)")


def gpu_processes() -> str:
    import subprocess

    from harness.launch import bounded

    r = bounded.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                    timeout_s=30, stdout=subprocess.PIPE, text=True)
    return (r.stdout or "").strip()


if __name__ == "__main__":
    main()
