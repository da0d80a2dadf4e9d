"""bench/teardown.py's per-run lines and --keep-missed, without torchrun (``one`` is faked): a
missed run's stage directory is copied whole, a right one is not, and the summary rows keep
their columns (old bench logs stay comparable). Then the bench's NCCL hang as the classifier
sees it (harness/launch/failures.py _stuck_rank), built from the files its ranks leave."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import teardown as B
from harness.launch import failures as F

pytestmark = pytest.mark.cpu


def fake_one(right_for: set[int]):
    """A stand-in for B.one: leaves a stage directory as run_stage would, right iff k in right_for."""
    def one(tmp: Path, kind, k, nproc, guard, pg_timeout, env=None, stage_timeout=120.0, start=None):
        for sub in ("logs", "stacks", "errors"):
            (tmp / sub).mkdir(parents=True, exist_ok=True)
        (tmp / "torchrun.log").write_text("torchrun\n")
        (tmp / "logs" / f"rank{k}.log").write_text(f"[inject] {kind} on rank {k}\n")
        (tmp / "stacks" / "rank0.txt").write_text("pid 1\n")
        (tmp / "stage.json").write_text("{}")
        ok = k in right_for
        return 1.5, ok, False, f"named rank {k if ok else 0} hang/hang; secondaries 1 all labelled"
    return one


def run_main(monkeypatch, capsys, args: list[str]) -> str:
    monkeypatch.setattr(sys, "argv", ["teardown.py", *args])
    B.main()
    return capsys.readouterr().out


def test_a_missed_run_is_kept_whole_and_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(B, "one", fake_one(right_for={0}))
    keep = tmp_path / "missed-world2"
    out = run_main(monkeypatch, capsys, ["--kinds", "hang", "--count", "2", "--nproc", "2",
                                         "--keep-missed", str(keep)])
    lines = out.splitlines()
    runs = [ln for ln in lines if ln.startswith("  run ")]
    assert runs[0] == "  run hang guard 0 injected rank 0: named rank 0 hang/hang; secondaries 1 all labelled; teardown 1.50 s; right yes"
    assert runs[1].startswith("  run hang guard 1 injected rank 1: named rank 0 ") and runs[1].endswith("right no")
    assert len(runs) == 4  # guard and plain, 2 each
    # only the misses (k = 1: i = 1 of each mode) are kept, every file of the stage directory
    assert sorted(p.name for p in keep.iterdir()) == ["hang-guard-1", "hang-plain-1"]
    d = keep / "hang-guard-1"
    assert {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()} == {
        "torchrun.log", "stage.json", "logs/rank1.log", "stacks/rank0.txt"}
    # the summary rows: the header and the same columns as before
    assert "kind      mode      n  median s   max s  right orphans" in lines
    assert B._row("hang", "guard", [1.5, 1.5], 1, 0, 2) in lines
    assert "hang      guard     2      1.50    1.50   1/2        0" in lines


def test_without_keep_missed_nothing_is_copied(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(B, "one", fake_one(right_for=set()))
    monkeypatch.chdir(tmp_path)
    out = run_main(monkeypatch, capsys, ["--kinds", "raise", "--count", "1", "--nproc", "2"])
    assert "kept" not in out and list(tmp_path.iterdir()) == []


def test_named_guard_says_when_a_secondary_is_not_labelled():
    from harness.launch.failures import RankFailure

    class R:
        cause = RankFailure(1, "bench", "hang", "hang", "stuck")
        secondaries = [RankFailure(0, "bench", "signal", "SIGABRT", "died", secondary=False)]

    assert B.named_guard(R) == "named rank 1 hang/hang; secondaries 1 NOT all labelled"
    R.cause, R.secondaries = None, []
    assert B.named_guard(R).startswith("no cause named")


# What a peer's log ends with when TORCH_NCCL_ASYNC_ERROR_HANDLING=3 has its watchdog abort it
# (torch ProcessGroupNCCL.cpp, then libstdc++'s terminate message)
NCCL_WATCHDOG_ABORT = (
    "[rank2]:[E1206 11:50:01.1 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
    "Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, NumelIn=16, NumelOut=16, "
    "Timeout(ms)=10000) ran for 10001 milliseconds before timing out.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with "
    "exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, "
    "OpType=ALLREDUCE) ran for 10001 milliseconds before timing out.\n")


# A rank's stacks file as the guard leaves it (harness/rank/guard.py _arm_stack_dumps): the
# "pid" line always, then a faulthandler dump only if SIGTERM/SIGUSR1 came. A peer the NCCL
# watchdog aborts (SIGABRT, no handler) leaves the "pid" line alone.
def stacks_file(pid: int, *frames: str) -> str:
    dump = "".join(f"  {f}\n" for f in frames)
    return f"pid {pid}\n" + (f"Current thread 0x00007f0000000000 (most recent call first):\n{dump}" if frames else "")


@pytest.mark.parametrize("world,k", [(2, 0), (2, 1), (4, 2), (8, 2), (8, 7)])
def test_an_nccl_hang_at_any_rank_is_named_over_lower_peers_the_watchdog_aborted(world, k):
    """bench/teardown.py --nccl-shared-gpu, hang, --pg-timeout 10: right at k = 0, wrong at
    k = 1 (world 2) and k = 2 (worlds 4, 8) on the H100. The peers' watchdogs abort them
    (SIGABRT, their stacks file holds only its "pid" line); torchrun SIGTERMs the rest: the hung
    rank (its dump outside any collective) and any peer still waiting (its dump in a collective).
    The lowest aborted peer, with a "stack" of one pid line, sorted before the hung rank."""
    hung = 'File "/repo/harness/rank/inject.py", line 77 in _fire'
    waiting = 'File "/x/torch/distributed/distributed_c10d.py", line 4811 in barrier'
    exits = []
    for r in range(world):
        if r == k:
            exits.append(F.RankExit(rank=r, pid=100 + r, exitcode=-15, died_at=11.0, signalled=True,
                                    stack=stacks_file(100 + r, hung)))
        elif r % 2 == 0 or world == 2:  # aborted by its own watchdog before torchrun's SIGTERM
            exits.append(F.RankExit(rank=r, pid=100 + r, exitcode=-6, died_at=10.0 + r / 100,
                                    log_tail=NCCL_WATCHDOG_ABORT.replace("Rank 2", f"Rank {r}"),
                                    stack=stacks_file(100 + r)))
        else:  # still waiting when torchrun's SIGTERM came
            exits.append(F.RankExit(rank=r, pid=100 + r, exitcode=-15, died_at=11.0, signalled=True,
                                    stack=stacks_file(100 + r, waiting)))
    cause, sec = F.classify("bench", [], exits)
    assert (cause.rank, cause.kind) == (k, "hang"), cause.line()
    assert "stuck outside any collective" in cause.message
    assert {s.rank for s in sec} == set(range(world)) - {k} and all(s.secondary for s in sec)


def test_peers_the_watchdog_aborted_are_never_named_stuck_outside_a_collective():
    """Every rank aborted by its NCCL watchdog and no dump anywhere (all timed out waiting, as a
    collective mismatch on NCCL would): none was stuck outside a collective, and none is said to be."""
    exits = [F.RankExit(rank=r, pid=100 + r, exitcode=-6, died_at=10.0 + r / 100,
                        log_tail=NCCL_WATCHDOG_ABORT.replace("Rank 2", f"Rank {r}"),
                        stack=stacks_file(100 + r)) for r in (1, 0)]
    cause, sec = F.classify("bench", [], exits)
    assert (cause.rank, cause.kind, cause.exc_type) == (0, "signal", "c10::DistBackendError")
    assert "stuck outside" not in cause.message
    assert [s.rank for s in sec] == [1]


def test_inject_ranks_pick_the_rank_of_each_run():
    assert B.injected_ranks(None, 4, 4) == [0, 2, 0, 1]  # the default, as before
    assert B.injected_ranks("last", 8, 2) == [7, 7]
    assert B.injected_ranks("1,last", 4, 3) == [1, 3, 1]
    with pytest.raises(SystemExit, match=r"--inject-ranks 2: 2 not a rank in 0\.\.1 or 'last'"):
        B.injected_ranks("2", 2, 1)
    with pytest.raises(SystemExit, match=r"--inject-ranks x,1: x not a rank in 0\.\.3 or 'last'"):
        B.injected_ranks("x,1", 4, 1)


@pytest.mark.slow  # the signal path stays in tests/test_interrupts.py
def test_a_sigterm_to_the_bench_takes_its_running_stage_down(tmp_path):
    """``timeout`` SIGTERMs the bench while a stage's ranks hang: every rank goes with it (on the
    H100 a bench cut by its bound left 14 ranks holding GPU memory)."""
    import os
    import signal
    import subprocess

    from harness import bounded as bounded_process
    from harness.paths import REPO_ROOT
    from tests.helpers import TEARDOWN_LIMIT_S, interrupt_once_staged, stage_processes, wait_for

    proc = bounded_process.start(
        [sys.executable, "bench/teardown.py", "--kinds", "hang", "--count", "1", "--nproc", "2",
         "--pg-timeout", "120", "--stage-timeout", "120"],
        cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc, out, _ = interrupt_once_staged(proc, tmp_path, signal.SIGTERM)
    assert wait_for(lambda: not stage_processes(tmp_path), TEARDOWN_LIMIT_S), \
        f"ranks left after the bench exited: {stage_processes(tmp_path)}"
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
