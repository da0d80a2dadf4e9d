"""Controller side: the processes of one stage, and their teardown in bounded time.

Why: nothing may outlive a stage. torch elastic starts each rank in a session of its own, so
the ranks are found (``discover``) and their process groups are signalled one by one, besides
torchrun's; whatever is left in their sessions afterwards is killed and reported as leftover.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

import psutil

POLL_S = 0.05
SIGNALLED_EXIT_S = 2.0  # how long a SIGKILLed group member may take to exit before it is a leftover


@dataclass
class Rank:
    rank: int
    pid: int
    proc: psutil.Process
    died_at: float | None = None
    node: int = 0  # index of the torchrun agent that started it


@dataclass
class Watch:
    """Mutable state of one stage while it runs."""

    ranks: dict[int, Rank] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)  # children not yet exec'd into a rank
    first_failure_at: float | None = None
    signalled_at: float | None = None  # when the controller first signalled the job
    signalled_pids: set[int] = field(default_factory=set)
    interrupted: str | None = None  # set when the controller was told to stop


def discover(proc: subprocess.Popen, w: Watch) -> None:
    """Map torchrun's children to global ranks (RANK in their environment, once exec'd; a
    forked rank's comes from its agent, harness/launch/warm.py ``rank_of``)."""
    rank_of = getattr(proc, "rank_of", None)
    for node, agent in enumerate(agent_pids(proc)):
        try:
            kids = psutil.Process(agent).children()
        except psutil.Error:
            continue
        known = {r.pid for r in w.ranks.values()}
        for k in kids:
            if k.pid in known:
                continue
            try:
                rank = rank_of(k.pid) if rank_of else k.environ().get("RANK")
            except psutil.Error:
                rank = None
            if rank is not None:
                w.ranks[int(rank)] = Rank(int(rank), k.pid, k, node=node)


def agent_pids(proc) -> list[int]:
    """The pid of torchrun, or of every agent of a multi-node stage (harness/launch/nodes.py)."""
    return [p.pid for p in getattr(proc, "procs", [proc])]


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_session(proc: subprocess.Popen, grace_s: float) -> list[int]:
    """Kill torchrun and every rank it started (SIGTERM, ``grace_s``, SIGKILL), then anything
    left in their sessions; returns the pids that had to be reaped that way."""
    w = Watch()
    discover(proc, w)
    kill_session(proc, w, grace_s)
    return reap_leftovers(agent_pids(proc), w)


def kill_session(proc: subprocess.Popen, w: Watch, grace_s: float) -> None:
    """SIGTERM then SIGKILL torchrun and every rank; returns once all of them are gone.

    torch elastic starts each rank in a session of its own, so the ranks' process groups are
    signalled one by one, besides torchrun's."""
    live = [r for r in w.ranks.values() if r.died_at is None and alive(r.proc)]
    if proc.poll() is None or live:
        w.signalled_at = w.signalled_at or time.time()
        w.signalled_pids |= {r.pid for r in live}
        for pgid in _groups(proc, w):
            signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        for pgid in _groups(proc, w):
            signal_group(pgid, signal.SIGKILL)
        proc.wait(timeout=10)
    deadline = time.time() + 5
    while time.time() < deadline:
        _note_deaths_quiet(w)
        if all(r.died_at is not None for r in w.ranks.values()):
            return
        for pgid in _groups(proc, w):
            signal_group(pgid, signal.SIGKILL)
        time.sleep(POLL_S)


def _groups(proc: subprocess.Popen, w: Watch) -> list[int]:
    """torchrun's process group and every rank's (elastic makes every rank a session leader).

    A rank that died of the SIGTERM still counts: its group may hold a process that ignores
    SIGTERM, such as the resource tracker of a rank's spawn Manager (the torch_dist save starts
    one), which only the SIGKILL to the group ends (seen as 2 leftovers in a pool timeout)."""
    return agent_pids(proc) + [r.pid for r in w.ranks.values()]


def _note_deaths_quiet(w: Watch) -> None:
    now = time.time()
    for r in w.ranks.values():
        if r.died_at is None and not alive(r.proc):
            r.died_at = now


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_leftovers(sid: int | list[int], w: Watch) -> list[int]:
    """Every process still in torchrun's (each agent's) or a rank's session: SIGKILL it and report it."""
    sids = {*(sid if isinstance(sid, list) else [sid]), *(r.pid for r in w.ranks.values())}
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) in sids and alive(p):
                left.append(p)
        except (OSError, psutil.Error):
            continue
    left += [r.proc for r in w.ranks.values() if alive(r.proc) and r.proc not in left]
    if w.signalled_at is not None and left:
        # The teardown SIGKILLed whole process groups: a member (e.g. the resource tracker of a
        # rank's spawn Manager) may still be exiting on a loaded machine. Only what outlives
        # that is a leftover; a process outside the signalled groups stays alive and counts.
        _, left = psutil.wait_procs(left, timeout=SIGNALLED_EXIT_S)
    kill_and_wait(left)
    run_pids = {r.pid for r in w.ranks.values()} | {p.pid for p in left}
    return sorted({p.pid for p in left} | set(_gpu_holders(run_pids)))


def kill_and_wait(procs: list[psutil.Process], timeout_s: float = 5.0) -> None:
    """SIGKILL each process and wait (bounded) until they are gone."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)


def _gpu_holders(run_pids: set[int], wait_s: float = 5.0) -> list[int]:
    """PIDs of this run that still hold GPU memory after teardown (nvidia-smi's compute apps).

    The driver frees a dead process's memory shortly after it exits, so poll a few seconds
    before calling it a leftover. No nvidia-smi (cpu tier): nothing to check.
    """
    import shutil

    if not run_pids or not shutil.which("nvidia-smi"):
        return []
    deadline = time.time() + wait_s
    while True:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30,
            ).stdout
        except (subprocess.SubprocessError, OSError):
            return []
        held = sorted(run_pids & {int(x) for x in out.split() if x.strip().isdigit()})
        if not held or time.time() > deadline:
            return held
        time.sleep(0.5)
