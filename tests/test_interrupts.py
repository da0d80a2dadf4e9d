"""Interrupts and concurrent runs of the real CLI on the cpu tier.

Ctrl-C (SIGINT) or a CI cancel (SIGTERM) must tear every stage down in seconds, record the
cells as ``interrupted`` (never a product failure) in a results.json marked incomplete, and
leave no process behind; two runs started at once must never share a run or checkpoint
directory.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from harness import bounded as bounded_process
from harness.paths import REPO_ROOT
from tests.helpers import (CPU_SAVE_ONLY_CELL, TEARDOWN_LIMIT_S, bounded, interrupt_a_hung_stage,
                           stage_processes, start_cli)

pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group("interrupts")]


# SIGTERM (a CI cancel) with ranks forked from a warm parent (fork, the cpu tier's mode) here;
# under -m slow: SIGTERM in fresh mode, SIGINT in pool mode in tests/test_pool.py, SIGINT in
# fresh and fork mode (each
# case is one torchrun, or one warm parent, of the full stack).
@pytest.mark.parametrize("sig, code, mode", [
    pytest.param(signal.SIGINT, 130, "fresh", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, 130, "fork", marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, 143, "fresh", marks=pytest.mark.slow), (signal.SIGTERM, 143, "fork")])
def test_a_signal_tears_down_and_leaves_a_partial_results_file(tmp_path, monkeypatch, sig, code, mode):
    monkeypatch.setenv("HARNESS_STAGE_MODE", mode)
    # every rank hangs after building its model: only the signal can end this stage
    proc, out, gone_s = interrupt_a_hung_stage(tmp_path, sig)
    assert proc.returncode == code, out
    assert gone_s < TEARDOWN_LIMIT_S, f"{gone_s:.1f} s from {sig.name} to exit\n{out}"
    assert stage_processes(tmp_path) == [], "ranks (or a warm parent) outlived the controller"
    assert bool(list(tmp_path.glob("*-interrupt/pools/fork-*/parent.log"))) == (mode == "fork")
    (results,) = tmp_path.glob("*-interrupt/results.json")
    doc = json.loads(results.read_text())
    assert doc["incomplete"] is True and doc["interrupted_by"] == sig.name
    (cell,) = doc["cells"]
    assert cell["outcome"] == "interrupted" and cell["failed_stage"] == "save", cell
    assert sig.name in cell["reason"] and cell["exception_type"] is None


RACE = """
import sys, time
from pathlib import Path
from harness.paths import RunDir
root, start = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # every process asks at the same moment
run = RunDir.new(root, "twin").root
(run / "owner").write_text(sys.argv[3])
print(run.name)
"""


def test_runs_started_at_once_get_their_own_run_directories(tmp_path):
    """The smaller case of the twin runs below (`make test`): processes that ask for a run
    directory at the same moment, with the same label, as two `python -m harness run` do, each
    get their own (the CLI's checkpoints, stages and pools live under it)."""
    n = 6
    start = time.time() + 3.0  # past every interpreter's start-up
    procs = [bounded_process.start([sys.executable, "-c", RACE, str(tmp_path), str(start), str(i)],
                                   cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
             for i in range(n)]
    try:
        names = [bounded_process.finish(p, 60).stdout.strip() for p in procs]
    finally:
        for p in procs:
            bounded_process.kill_group(p)
    assert [p.returncode for p in procs] == [0] * n, names
    assert len(set(names)) == n, names
    assert {(tmp_path / name / "owner").read_text() for name in names} == {str(i) for i in range(n)}


@pytest.mark.slow
def test_two_runs_started_at_once_share_nothing(tmp_path):
    procs = [start_cli(tmp_path, "run", "--cells", CPU_SAVE_ONLY_CELL, "--label", "twin")
             for _ in range(2)]
    outs = [bounded_process.finish(p, 400).stdout for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = sorted(tmp_path.glob("*-twin*"))
    assert len(runs) == 2, runs  # same second, same label: still two directories
    for run in runs:
        doc = json.loads((run / "results.json").read_text())
        assert [c["cell_id"] for c in doc["cells"]] == [CPU_SAVE_ONLY_CELL]
        assert doc["cells"][0]["outcome"] == "pass", doc["cells"][0]
        assert (run / "saves").is_dir() and not doc.get("incomplete")


SIGNAL_TWICE = """
import os, signal, sys, time
from harness.launch.signals import REPEAT_WINDOW_S, interrupt_on_signals, shutdown_signal
interrupt_on_signals()
os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` does
print("after the double", shutdown_signal(), flush=True)
time.sleep(REPEAT_WINDOW_S + 0.2)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)
except KeyboardInterrupt:
    print("a later one stops waiting", flush=True)
"""


def test_the_same_signal_delivered_twice_at_once_is_one_stop_a_later_one_stops_waiting():
    """GNU timeout signals its command and then the command's process group: the controller
    must still write its partial results, not take the repeat for a second Ctrl-C."""
    out = bounded([sys.executable, "-c", SIGNAL_TWICE], 60, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["after the double SIGTERM", "a later one stops waiting"]
