"""A child process in a session of its own, bounded in time: the one place that starts one and,
on timeout or any failure while waiting for it, kills its whole process group.

Why: the children here (``harness run``, ``make``, pytest, a matrix environment's pip) start
children of their own; killing only the child leaves those running with the caller gone. The
caller decides what a timeout means (raise, or a row saying so): ``Finished.timed_out`` says it
happened. A torchrun stage is watched and torn down by torchrun.py and teardown.py instead.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finished:
    """How a bounded child ended. ``returncode`` is its own (negative: the signal that ended it,
    ours on a timeout); ``stdout``/``stderr`` are what it wrote where the caller asked for pipes."""

    args: Any
    timeout_s: float
    returncode: int
    stdout: Any = None
    stderr: Any = None
    timed_out: bool = False  # it ran past its limit and its group was killed

    def raise_if_timed_out(self) -> Finished:
        """For callers to whom a timeout is an error: ``subprocess.TimeoutExpired``, as
        ``subprocess.run`` raises it (the group already killed)."""
        if self.timed_out:
            raise subprocess.TimeoutExpired(self.args, self.timeout_s, self.stdout, self.stderr)
        return self


def start(cmd: list[str], **popen_kw) -> subprocess.Popen:
    """``cmd`` in a new session, so its group is every process it starts (``Popen`` keywords)."""
    return subprocess.Popen(cmd, start_new_session=True, **popen_kw)


def kill_group(proc: subprocess.Popen, term_grace_s: float = 0.0) -> None:
    """Kill ``proc``'s process group while ``proc`` still runs, and reap ``proc``. With a grace,
    SIGTERM first (a ``harness run`` then writes its results marked incomplete), SIGKILL after."""
    if proc.poll() is not None:
        return
    try:
        if term_grace_s > 0:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=term_grace_s)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group ended between the poll and the signal
        pass
    proc.wait()


def finish(proc: subprocess.Popen, timeout_s: float, term_grace_s: float = 0.0) -> Finished:
    """Wait up to ``timeout_s`` for a child of ``start``; past it, or on any exception while
    waiting (Ctrl-C included, then re-raised), its group is killed."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc, term_grace_s)
        out, err = proc.communicate()
        return Finished(proc.args, timeout_s, proc.returncode, out, err, timed_out=True)
    except BaseException:
        kill_group(proc, term_grace_s)
        raise
    return Finished(proc.args, timeout_s, proc.returncode, out, err)


def run(cmd: list[str], timeout_s: float, term_grace_s: float = 0.0, **popen_kw) -> Finished:
    """``start`` then ``finish``: ``cmd`` run to its end or killed with its group at ``timeout_s``."""
    return finish(start(cmd, **popen_kw), timeout_s, term_grace_s)
