"""Teardown latency and attribution accuracy: guarded ranks vs plain torchrun.

Injects each failure kind ``--count`` times into the tiny gloo rank program and prints, per kind
and mode, first-failure -> all-gone latency (median, max) and how often the cause was the
injected rank. "plain" runs the same program without rank_guard (``--no-guard``): torchrun's
own teardown, attributed by its "Root Cause" block, which is what the guard replaces.
``--nccl-shared-gpu``: the same on NCCL (CUDA tensors, every rank on GPU 0 with its own NCCL
host id, harness/rank/shared_gpu.py; GPU host only, kinds raise, sigkill, hang), and afterwards
the GPU's compute processes as nvidia-smi lists them (none of ours may be left).
``--deaf-peers``: the injected rank's peers ignore SIGTERM and wait outside Python (as NCCL
ranks blocked in a collective do), so only the final kill ends them; ``--compare-term-grace``
then times that kill's SIGTERM grace before (TERM_GRACE_S) and since a primary error shortens
it (CAUSE_KNOWN_TERM_GRACE_S, harness/launch/torchrun.py), guarded both, side by side.
Each run prints one line ("  run ...": injected rank, the rank and cause named, secondaries
labelled, teardown seconds); ``--keep-missed DIR`` copies the stage directory of each run whose
cause was not named right to DIR/<kind>-<mode>-<i>/ before the temporary directory goes.
``--inject-ranks`` picks the injected ranks (run i takes the i-th, cycling; ``last`` is the
highest rank): an NCCL hang run lasts about 90 s (the 10 s group timeout, then the watchdog's
flight-recorder dump before its abort), so a short lease runs only the case in question. A
SIGTERM (``timeout``) tears the running stage down before the bench exits: ranks live in
sessions of their own and outlived a killed bench on the H100 (14 left, 2026-12-06).
``--fork``: guarded ranks in a fresh torchrun against guarded ranks forked from one warm
parent by torch's elastic launcher (stage mode fork, harness/launch/warm.py), whose processes
besides the parent count as orphans after each run.
Figures only, no timed asserts.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from harness.records import Patch
from harness.tiers import Backend, Tier
from harness.jsonfile import write_json_atomic
from harness.launch import torchrun
from harness.launch.signals import exit_cleanly_on_sigterm
from harness.launch.torchrun import run_stage

PROGRAM = "tests.rank_programs.collectives"
ROOT_RANK = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:.*?rank\s*:\s*(\d+)", re.S)


def nccl_shared_env() -> dict:
    """The stage environment of tier gpu's shared-GPU mode, for the collectives program."""
    from harness.rank.guard import nccl_env
    from harness.rank.shared_gpu import SHARED_GPU_ENV

    return {**nccl_env(), SHARED_GPU_ENV: "1", "HARNESS_COLLECTIVES_BACKEND": "nccl"}


def one(tmp: Path, kind: str, k: int, nproc: int, guard: bool, pg_timeout: float,
        env: dict | None = None, stage_timeout: float = 120.0,
        start=run_stage) -> tuple[float | None, bool, bool, str]:
    """(teardown seconds, attributed right, leftovers, what was named) for one injected run;
    ``start``: run_stage, or a warm parent's (``forked``)."""
    env = {**(env or {}), "HARNESS_INJECT": f"{kind}:{k}:before_save"}
    if env.get("HARNESS_COLLECTIVES_BACKEND") == "nccl":  # the flight-recorder dumps stay with the run
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(Path(tmp).resolve() / "nccl_trace_rank_")
    r = start("bench", tmp, nproc, [] if guard else ["--no-guard"], stage_timeout, env=env,
              rank_module=PROGRAM, pg_timeout_s=pg_timeout)
    write_json_atomic(Path(tmp) / "stage.json", r.result().to_json())  # kept with a missed run
    if guard:
        right = r.cause is not None and r.cause.rank == k
        if kind == "mismatch":  # a peer detecting the odd message is the honest answer on gloo
            right = r.cause is not None and not r.cause.secondary
        return r.teardown_s, right, bool(r.leftovers), named_guard(r)
    log = (tmp / "torchrun.log").read_text(errors="replace")
    m = ROOT_RANK.search(log)
    right = bool(m) and int(m.group(1)) == k
    # plain: no error files; first failure is the first rank death the controller saw
    named = f"torchrun root cause rank {m.group(1)}" if m else "torchrun root cause: none printed"
    return r.teardown_s, right, bool(r.leftovers), named


def forked(root: Path):
    """run_stage's stand-in for fork mode: one warm parent for every run, and a run's leftovers
    also any process of that parent's but the parent itself."""
    from harness.launch.pool import pool_processes
    from harness.launch.warm import WARM, parent_key

    key = parent_key(Tier.CPU, Patch.NONE, Backend.LOCAL, root)

    def start(*args, **kw):
        r = WARM.run(key, *args, **kw)
        parent = WARM.get(key)
        r.leftovers += [p.pid for p in pool_processes(parent.dir) if p.pid != parent.proc.pid]
        return r
    return start


def named_guard(r) -> str:
    """The cause the harness named (rank, kind, exception type) and whether every other failing
    rank was labelled secondary."""
    c = r.cause
    what = "no cause named" if c is None else f"named rank {c.rank} {c.kind}/{c.exc_type}"
    labelled = all(s.secondary for s in r.secondaries)
    return (f"{what}; secondaries {len(r.secondaries)} "
            f"{'all labelled' if labelled else 'NOT all labelled'}")


def run_line(kind: str, mode: str, i: int, k: int, named: str, t: float | None, right: bool) -> str:
    ts = f"{t:.2f} s" if t is not None else "n/a"
    return f"  run {kind} {mode} {i} injected rank {k}: {named}; teardown {ts}; right {'yes' if right else 'no'}"


def keep_missed(stage_dir: Path, keep: Path, kind: str, mode: str, i: int) -> Path | None:
    """Copy a missed run's stage directory (logs, stacks, errors, torchrun.log, ...) to
    keep/<kind>-<mode>-<i>/; None when it could not be copied (the bench goes on)."""
    dest = keep / f"{kind}-{mode}-{i}"
    try:
        shutil.copytree(stage_dir, dest, symlinks=True, dirs_exist_ok=True)
    except (OSError, shutil.Error) as e:
        print(f"  could not keep {stage_dir} in {dest}: {e}", flush=True)
        return None
    return dest


def injected_ranks(spec: str | None, nproc: int, count: int) -> list[int]:
    """The rank each run injects into: ``spec`` (ranks or ``last``, commas between, cycling),
    or by default 0 on even runs i and (i mod (nproc - 1)) + 1 on odd ones."""
    if not spec:
        return [(i % (nproc - 1)) + 1 if i % 2 else 0 for i in range(count)]
    words = [r.strip() for r in spec.split(",")]
    if bad := [r for r in words if r != "last" and not (r.isdigit() and int(r) < nproc)]:
        raise SystemExit(f"bench/teardown.py: --inject-ranks {spec}: {', '.join(bad)} not a rank "
                         f"in 0..{nproc - 1} or 'last'")
    ranks = [nproc - 1 if r == "last" else int(r) for r in words]
    return [ranks[i % len(ranks)] for i in range(count)]


def _row(kind: str, mode: str, lat: list, right: int, orphans: int, count: int) -> str:
    m = statistics.median(lat) if lat else float("nan")
    mx = max(lat) if lat else float("nan")
    return f"{kind:9} {mode:7} {len(lat):>3} {m:>9.2f} {mx:>7.2f} {right:>3}/{count:<2} {orphans:>7}"


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
    ap.add_argument("--deaf-peers", action="store_true",
                    help="the injected rank's peers ignore SIGTERM (tests/rank_programs/collectives.py)")
    ap.add_argument("--compare-term-grace", action="store_true",
                    help="modes: the final kill's SIGTERM grace before and since a known cause "
                         "shortens it, instead of guard and plain")
    ap.add_argument("--fork", action="store_true",
                    help="modes: guarded ranks in a fresh torchrun and forked from a warm parent")
    ap.add_argument("--keep-missed", type=Path, metavar="DIR",
                    help="copy the stage directory of each run whose cause was not named right "
                         "to DIR/<kind>-<mode>-<i>/")
    ap.add_argument("--inject-ranks", metavar="R[,R...]",
                    help="the rank run i injects into: the i-th of these, cycling; 'last' is the "
                         "highest (default: 0 on even runs i, (i mod (nproc-1)) + 1 on odd ones)")
    a = ap.parse_args()
    ranks = injected_ranks(a.inject_ranks, a.nproc, a.count)
    exit_cleanly_on_sigterm()
    env = nccl_shared_env() if a.nccl_shared_gpu else None
    if a.deaf_peers:
        env = {**(env or {}), "HARNESS_DEAF_PEERS": "1"}
    # (mode, guarded, the final kill's grace once a cause is known, fork); the ratio is second/first
    known = torchrun.CAUSE_KNOWN_TERM_GRACE_S
    modes = ([(f"term{known:g}", True, known, False),
              (f"term{torchrun.TERM_GRACE_S:g}", True, torchrun.TERM_GRACE_S, False)]
             if a.compare_term_grace else
             [("guard", True, known, False), ("fork", True, known, True)] if a.fork else
             [("guard", True, known, False), ("plain", False, known, False)])
    print(f"backend: {'nccl, ' + str(a.nproc) + ' ranks on one GPU' if a.nccl_shared_gpu else 'gloo'}"
          + (", peers deaf to SIGTERM" if a.deaf_peers else ""))
    rows = []
    header = f"{'kind':9} {'mode':7} {'n':>3} {'median s':>9} {'max s':>7} {'right':>6} {'orphans':>7}"
    print(header, flush=True)  # each row as it is done: a bound that cuts the bench keeps them
    with tempfile.TemporaryDirectory() as td:
        fork_start = forked(Path(td)) if a.fork else None
        for kind in a.kinds.split(","):
            for mode, guard, grace, fork in modes:
                torchrun.CAUSE_KNOWN_TERM_GRACE_S = grace
                lat, right, orphans = [], 0, 0
                for i, k in enumerate(ranks):
                    stage_dir = Path(td) / f"{kind}-{mode}-{i}"
                    t, ok, left, named = one(stage_dir, kind, k, a.nproc, guard, a.pg_timeout, env,
                                             a.stage_timeout, fork_start if fork else run_stage)
                    print(run_line(kind, mode, i, k, named, t, ok), flush=True)
                    if not ok and a.keep_missed is not None:
                        if kept := keep_missed(stage_dir, a.keep_missed, kind, mode, i):
                            print(f"  kept {kept}", flush=True)
                    lat += [t] if t is not None else []
                    right += ok
                    orphans += left
                rows.append((kind, mode, lat, right, orphans))
                print(_row(*rows[-1], a.count), flush=True)
        if a.fork:  # before its directory goes
            from harness.launch.warm import WARM

            WARM.close_all()
    med = {(kind, mode): statistics.median(lat) if lat else float("nan")
           for kind, mode, lat, _, _ in rows}
    (first, *_), (second, *_) = modes
    for kind in a.kinds.split(","):
        f, s = med[(kind, first)], med[(kind, second)]
        print(f"{kind}: {second}/{first} median teardown ratio = {s / f:.2f}" if f else f"{kind}: n/a")
    if a.nccl_shared_gpu:
        print("GPU compute processes after:", gpu_processes() or "(nvidia-smi lists none)")


def gpu_processes() -> str:
    import subprocess

    from harness import bounded

    r = bounded.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                    timeout_s=30, stdout=subprocess.PIPE, text=True)
    return (r.stdout or "").strip()


if __name__ == "__main__":
    main()
