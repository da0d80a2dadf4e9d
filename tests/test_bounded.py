"""harness/bounded.py: a child past its limit is killed with every process it started,
and the caller learns it (``timed_out``) or gets ``TimeoutExpired`` when it asks for one."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from harness import bounded

pytestmark = pytest.mark.cpu

# a shell that starts a grandchild, prints its pid and waits: both outlive any short limit
TREE = "sleep 60 & echo $!; wait"


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_child_in_time_gives_its_code_and_output():
    done = bounded.run([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], 60,
                       stdout=subprocess.PIPE, text=True)
    assert (done.returncode, done.stdout, done.timed_out) == (3, "hi\n", False)
    assert done.raise_if_timed_out() is done


def test_past_its_limit_the_whole_group_is_killed():
    done = bounded.run(["bash", "-c", TREE], 1, stdout=subprocess.PIPE, text=True)
    assert done.timed_out and done.returncode < 0
    assert _gone(int(done.stdout.split()[0])), "the grandchild outlived the timeout"
    with pytest.raises(subprocess.TimeoutExpired):
        done.raise_if_timed_out()


def test_sigterm_first_with_a_grace():
    trap = "trap 'echo term; exit 7' TERM; sleep 60 & wait"
    done = bounded.run(["bash", "-c", trap], 1, term_grace_s=5, stdout=subprocess.PIPE, text=True)
    assert done.timed_out and done.returncode == 7 and done.stdout == "term\n"


def test_an_exception_while_waiting_kills_the_group(monkeypatch):
    proc = bounded.start(["bash", "-c", TREE], stdout=subprocess.PIPE, text=True)
    grandchild = int(proc.stdout.readline())

    def interrupted(timeout=None):
        raise KeyboardInterrupt  # Ctrl-C while the caller waits

    monkeypatch.setattr(proc, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bounded.finish(proc, 60)
    assert proc.returncode is not None and _gone(grandchild)
