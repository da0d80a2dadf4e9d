"""Controller side: run one stage as its own torchrun, watch it, tear it down in bounded time.

Why: the first failing rank must be named, the fallout on its peers labelled, and nothing may
outlive the stage. The controller polls the stage directory (error files from rank_guard) and
the rank processes (psutil); after the first failure it gives torchrun a short grace to tear
down by itself, then kills the whole session. On timeout it first asks ranks for stack dumps.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from harness.launch import failures as F
from harness.jsonfile import read_json
from harness.paths import REPO_ROOT
from harness.records import StageCause, StageResult

POLL_S = 0.05
SIGNALLED_EXIT_S = 2.0  # how long a SIGKILLed group member may take to exit before it is a leftover
# Variables a parent torchrun/pytest-xdist might have set that would confuse the ranks.
_STRIP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")


@dataclass
class StageRun:
    stage: str
    ok: bool
    returncode: int | None
    wall_s: float
    timed_out: bool
    cause: F.RankFailure | None
    secondaries: list[F.RankFailure]
    rank_results: dict[int, dict]
    stage_dir: Path
    teardown_s: float | None  # first failure seen -> every rank and torchrun gone
    leftovers: list[int]
    first_failure_at: float | None = None
    all_gone_at: float | None = None
    interrupted: str | None = None  # the signal that stopped the controller (SIGINT, SIGTERM)
    rank_nodes: dict[int, int] = field(default_factory=dict)  # global rank -> agent (node) index
    started_at: float | None = None  # epoch: torchrun started (a pool: the job was handed over)

    def result(self) -> StageResult:
        """The typed record the rest of the controller works with (and writes as stage.json)."""
        c = self.cause
        return StageResult(
            stage=self.stage, ok=self.ok, wall_s=round(self.wall_s, 2), timed_out=self.timed_out,
            started_at=self.started_at,
            teardown_s=self.teardown_s, leftovers=self.leftovers,
            cause=None if c is None else StageCause(rank=c.rank, kind=c.kind, exc_type=c.exc_type,
                                                    message=c.message, key=c.key),
            secondaries=[f"rank {f.rank}: {f.exc_type or f.kind}: {f.first_line()}"
                         for f in self.secondaries],
            rank_results={str(k): v for k, v in self.rank_results.items()},
            summary=self.summary(),
            # versions the ranks imported (rank/setup.py record_environment); {} if none got there
            environment=read_json(self.stage_dir / "environment.json", default={}),
            interrupted=self.interrupted,
        )

    def summary(self) -> str:
        if self.interrupted:
            gone = f"; every rank gone in {self.teardown_s:.2f} s" if self.teardown_s is not None else ""
            return f"{self.stage}: INTERRUPTED by {self.interrupted} after {self.wall_s:.1f} s{gone}"
        if self.ok:
            return f"{self.stage}: ok in {self.wall_s:.1f} s ({len(self.rank_results)} ranks)"
        head = f"{self.stage}: FAILED" + (" (timed out)" if self.timed_out else "")
        lines = [head]
        if self.cause:
            c = self.cause
            lines.append(f"cause: rank {c.rank} [{c.stage}] {c.kind} {c.exc_type}: {c.first_line()}")
            if c.key:
                lines.append(f"  failing key: {c.key}")
        else:
            lines.append(f"cause: unknown (torchrun exit {self.returncode}); see {self.stage_dir}/torchrun.log")
        lines += [f"secondary: {s.line()}" for s in self.secondaries]
        if self.teardown_s is not None:
            lines.append(f"teardown: {self.teardown_s:.2f} s")
        if self.leftovers:
            lines.append(f"LEFTOVER processes killed: {self.leftovers}")
        return "\n".join(lines)


@dataclass
class _Rank:
    rank: int
    pid: int
    proc: psutil.Process
    died_at: float | None = None
    node: int = 0  # index of the torchrun agent that started it


@dataclass
class _Watch:
    """Mutable state of one stage while it runs."""

    ranks: dict[int, _Rank] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)  # children not yet exec'd into a rank
    first_failure_at: float | None = None
    signalled_at: float | None = None  # when the controller first signalled the job
    signalled_pids: set[int] = field(default_factory=set)
    interrupted: str | None = None  # set when the controller was told to stop


def stage_env(stage: str, stage_dir: Path, timeout_s: float, pg_timeout_s: float | None, extra: dict | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _STRIP_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["HARNESS_STAGE_DIR"] = str(stage_dir)
    env["HARNESS_STAGE"] = stage
    env["HARNESS_STAGE_TIMEOUT_S"] = str(timeout_s)
    env.setdefault("HARNESS_PG_TIMEOUT_S", str(pg_timeout_s if pg_timeout_s is not None else 60))
    # cuBLAS picks a fixed reduction order only with a fixed workspace; the logits probe runs
    # under torch's deterministic algorithms (harness/rank/logits.py), which ask for this
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run_stage(
    stage: str,
    stage_dir: Path,
    nproc: int,
    rank_args: list[str],
    timeout_s: float,
    env: dict | None = None,
    python: str = sys.executable,
    *,
    rank_module: str = "harness.rank",
    grace_s: float = 3.0,
    pg_timeout_s: float | None = None,
    nodes: int = 1,
) -> StageRun:
    """Run ``torchrun -m rank_module rank_args`` with ``nproc`` ranks; never leaves a process behind.

    ``nodes > 1``: as many torchrun agents on this machine, ``nproc // nodes`` ranks each, joined
    by a c10d rendezvous (the multi-node launch, testable without a second machine)."""
    if nodes < 1 or nproc % nodes:
        raise ValueError(f"{nproc} ranks do not split over {nodes} nodes")
    stage_dir = Path(stage_dir).resolve()
    if _SHUTDOWN.is_set():  # the run was interrupted: start nothing new
        return not_started(stage, stage_dir)
    make_stage_dirs(stage_dir)
    t0 = time.time()
    env = stage_env(stage, stage_dir, timeout_s, pg_timeout_s, env)
    if nodes > 1:
        proc = _start_agents(stage, stage_dir, nproc, nodes, rank_module, rank_args, python, env)
    else:
        proc = start_torchrun(nproc, rank_module, rank_args, stage_dir / "torchrun.log", env, python)
    after = (lambda: _join_agent_logs(stage_dir, nodes)) if nodes > 1 else None
    return supervise(stage, stage_dir, proc, t0, timeout_s, grace_s, before_collect=after)


def not_started(stage: str, stage_dir: Path) -> StageRun:
    """The record of a stage the interrupted controller did not start."""
    return StageRun(stage=stage, ok=False, returncode=None, wall_s=0.0, timed_out=False,
                    cause=None, secondaries=[], rank_results={}, stage_dir=stage_dir,
                    teardown_s=None, leftovers=[], interrupted=shutdown_signal())


def make_stage_dirs(stage_dir: Path) -> None:
    for sub in ("logs", "errors", "stacks", "ranks"):
        (stage_dir / sub).mkdir(parents=True, exist_ok=True)


def start_torchrun(nproc: int, rank_module: str, rank_args: list[str], log_path: Path, env: dict,
                   python: str = sys.executable) -> subprocess.Popen:
    """One single-node torchrun in a session of its own, its output in ``log_path``."""
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--max-restarts", "0",
           "-m", rank_module, *rank_args]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env, cwd=REPO_ROOT)


def supervise(stage: str, stage_dir: Path, proc, t0: float, timeout_s: float, grace_s: float, *,
              done: Callable[[], bool] | None = None,
              before_collect: Callable[[], None] | None = None) -> StageRun:
    """Watch one stage of ``proc`` to its end and build its StageRun.

    Without ``done`` the stage ends with torchrun, which is then torn down. With ``done`` (a
    warm rank pool, harness/launch/pool.py) it also ends when ``done()`` says every rank has
    finished; a clean such end leaves torchrun running, anything else kills its session.
    """
    w = _Watch()
    timed_out = finished = False
    try:
        timed_out = _watch(proc, stage_dir, w, t0, timeout_s, grace_s, done)
        finished = (done is not None and not timed_out and w.first_failure_at is None
                    and proc.poll() is None and done())
    finally:
        if not finished:
            _kill_session(proc, w, grace_s=0.0 if timed_out else 1.0)
    all_gone = time.time()
    leftovers = [] if finished else _reap_leftovers(_agent_pids(proc), w)
    if before_collect:
        before_collect()
    return _collect(stage, stage_dir, proc, w, t0, all_gone, timed_out and not w.interrupted,
                    leftovers, returncode=0 if finished else proc.returncode)


def end_session(proc: subprocess.Popen, grace_s: float) -> list[int]:
    """Kill torchrun and every rank it started (SIGTERM, ``grace_s``, SIGKILL), then anything
    left in their sessions; returns the pids that had to be reaped that way."""
    w = _Watch()
    _discover(proc, w)
    _kill_session(proc, w, grace_s)
    return _reap_leftovers(_agent_pids(proc), w)


def _watch(proc: subprocess.Popen, stage_dir: Path, w: _Watch, t0: float, timeout_s: float,
           grace_s: float, done: Callable[[], bool] | None = None) -> bool:
    """Poll until torchrun exits (or ``done()``); True when the stage timed out."""
    errors_dir = stage_dir / "errors"
    while proc.poll() is None and not (done is not None and done()):
        now = time.time()
        _discover(proc, w)
        _note_deaths(stage_dir, w, now)
        if w.first_failure_at is None and any(errors_dir.glob("rank*.json")):
            w.first_failure_at = _earliest_error_time(errors_dir) or now
        if w.first_failure_at is None and isinstance(proc, _Agents) and proc.failed():
            w.first_failure_at = now  # one node gave up: the others would wait in rendezvous
        if w.first_failure_at is not None and now - max(w.first_failure_at, t0) > grace_s:
            return False  # torchrun did not finish tearing down: the caller kills the session
        if _SHUTDOWN.is_set():  # interrupted: no stack dump, tear down at once
            w.interrupted = shutdown_signal()
            w.first_failure_at = w.first_failure_at or now
            return True
        if now - t0 > timeout_s:
            w.first_failure_at = w.first_failure_at or now
            _dump_stacks(stage_dir, w)
            return True
        time.sleep(POLL_S)
    _note_deaths(stage_dir, w, time.time())
    return False


def _discover(proc: subprocess.Popen, w: _Watch) -> None:
    """Map torchrun's children to global ranks (RANK in their environment, once exec'd)."""
    for node, agent in enumerate(_agent_pids(proc)):
        try:
            kids = psutil.Process(agent).children()
        except psutil.Error:
            continue
        known = {r.pid for r in w.ranks.values()}
        for k in kids:
            if k.pid in known:
                continue
            try:
                rank = k.environ().get("RANK")
            except psutil.Error:
                rank = None
            if rank is not None:
                w.ranks[int(rank)] = _Rank(int(rank), k.pid, k, node=node)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _note_deaths(stage_dir: Path, w: _Watch, now: float) -> None:
    for r in w.ranks.values():
        if r.died_at is None and not _alive(r.proc):
            r.died_at = now
            ok = (stage_dir / "ranks" / f"rank{r.rank}.json").exists()
            if not ok and w.first_failure_at is None:
                w.first_failure_at = min(now, _earliest_error_time(stage_dir / "errors") or now)


def _earliest_error_time(errors_dir: Path) -> float | None:
    times = [e.get("time") for e in _read_jsons(errors_dir).values()]
    times = [t for t in times if isinstance(t, (int, float))]
    return min(times) if times else None


def _read_jsons(d: Path) -> dict[int, dict]:
    out = {}
    for p in sorted(d.glob("rank*.json")):
        try:
            out[int(p.stem[4:])] = json.loads(p.read_text())
        except (ValueError, OSError):
            continue
    return out


def _dump_stacks(stage_dir: Path, w: _Watch, wait_s: float = 2.0) -> None:
    """SIGUSR1 each live rank whose guard installed the handler (its stacks file names its pid;
    without the handler SIGUSR1 would kill it), then give the dumps time to land."""
    sent = False
    for r in w.ranks.values():
        try:
            first = (stage_dir / "stacks" / f"rank{r.rank}.txt").read_text().split("\n", 1)[0]
            if first == f"pid {r.pid}" and _alive(r.proc):
                r.proc.send_signal(signal.SIGUSR1)
                sent = True
        except (OSError, psutil.Error):
            continue
    if sent:
        time.sleep(wait_s)


def _kill_session(proc: subprocess.Popen, w: _Watch, grace_s: float) -> None:
    """SIGTERM then SIGKILL torchrun and every rank; returns once all of them are gone.

    torch elastic starts each rank in a session of its own, so the ranks' process groups are
    signalled one by one, besides torchrun's."""
    live = [r for r in w.ranks.values() if r.died_at is None and _alive(r.proc)]
    if proc.poll() is None or live:
        w.signalled_at = w.signalled_at or time.time()
        w.signalled_pids |= {r.pid for r in live}
        for pgid in _groups(proc, w):
            _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        for pgid in _groups(proc, w):
            _signal_group(pgid, signal.SIGKILL)
        proc.wait(timeout=10)
    deadline = time.time() + 5
    while time.time() < deadline:
        _note_deaths_quiet(w)
        if all(r.died_at is not None for r in w.ranks.values()):
            return
        for pgid in _groups(proc, w):
            _signal_group(pgid, signal.SIGKILL)
        time.sleep(POLL_S)


def _groups(proc: subprocess.Popen, w: _Watch) -> list[int]:
    """torchrun's process group and every rank's (elastic makes every rank a session leader).

    A rank that died of the SIGTERM still counts: its group may hold a process that ignores
    SIGTERM, such as the resource tracker of a rank's spawn Manager (the torch_dist save starts
    one), which only the SIGKILL to the group ends (seen as 2 leftovers in a pool timeout)."""
    return _agent_pids(proc) + [r.pid for r in w.ranks.values()]


def _note_deaths_quiet(w: _Watch) -> None:
    now = time.time()
    for r in w.ranks.values():
        if r.died_at is None and not _alive(r.proc):
            r.died_at = now


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_leftovers(sid: int | list[int], w: _Watch) -> list[int]:
    """Every process still in torchrun's (each agent's) or a rank's session: SIGKILL it and report it."""
    sids = {*(sid if isinstance(sid, list) else [sid]), *(r.pid for r in w.ranks.values())}
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) in sids and _alive(p):
                left.append(p)
        except (OSError, psutil.Error):
            continue
    left += [r.proc for r in w.ranks.values() if _alive(r.proc) and r.proc not in left]
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


def _collect(stage: str, stage_dir: Path, proc: subprocess.Popen, w: _Watch, t0: float,
             all_gone: float, timed_out: bool, leftovers: list[int], returncode: int | None) -> StageRun:
    results = _read_jsons(stage_dir / "ranks")
    errors = list(_read_jsons(stage_dir / "errors").values())
    tr_log = (stage_dir / "torchrun.log").read_text(errors="replace")
    elastic = F.parse_elastic_failures(tr_log)
    by_elastic = F.parse_elastic_signalled(tr_log) | w.signalled_pids
    exits = []
    for rank in sorted(set(w.ranks) | set(elastic)):
        if rank in results and rank not in {int(e["rank"]) for e in errors}:
            continue
        r = w.ranks.get(rank)
        code, pid = elastic.get(rank, (None, r.pid if r else None))
        exits.append(F.RankExit(
            rank=rank, pid=pid, exitcode=code, died_at=r.died_at if r else None,
            signalled=pid in by_elastic, log_tail=_tail(stage_dir / "logs" / f"rank{rank}.log"),
            stack=_tail(stage_dir / "stacks" / f"rank{rank}.txt", 20000),
        ))
    failed = returncode != 0 or timed_out or bool(errors) or bool(w.interrupted)
    classify = failed and not w.interrupted  # an interrupted stage has no product failure to name
    cause, secondaries = F.classify(stage, errors, exits, timed_out=timed_out) if classify else (None, [])
    first = w.first_failure_at
    if first is None and failed:
        first = min((f.time for f in [cause, *secondaries] if f and f.time), default=None)
    return StageRun(
        stage=stage, ok=not failed, returncode=returncode, wall_s=all_gone - t0,
        timed_out=timed_out, cause=cause, secondaries=secondaries, rank_results=results,
        stage_dir=stage_dir, teardown_s=(all_gone - first) if first else None, leftovers=leftovers,
        first_failure_at=first, all_gone_at=all_gone, interrupted=w.interrupted,
        rank_nodes={r.rank: r.node for r in w.ranks.values()}, started_at=t0,
    )


def node_command(node_rank: int, nnodes: int, nproc_per_node: int, rdzv_endpoint: str,
                 rdzv_id: str, rank_args: list[str], *, rank_module: str = "harness.rank",
                 python: str = sys.executable, is_host: bool | None = None) -> list[str]:
    """The torchrun argv one node of a multi-node stage runs (Slurm script, docs, the local test).

    c10d ignores ``--node-rank`` (group ranks follow rendezvous order); it is passed for the logs.
    ``is_host`` pins which agent serves the rendezvous store; None lets torch match the hostname.
    """
    cmd = [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
           "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id, "--max-restarts", "0"]
    if is_host is not None:
        cmd += ["--rdzv-conf", f"is_host={int(is_host)}"]
    return cmd + ["-m", rank_module, *rank_args]


class _Agents:
    """Several torchrun agents of one stage, watched like one Popen: running while any runs."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    @property
    def returncode(self) -> int | None:
        codes = [p.returncode for p in self.procs]
        return None if None in codes else next((c for c in codes if c != 0), 0)

    def poll(self) -> int | None:
        for p in self.procs:
            p.poll()
        return self.returncode

    def failed(self) -> bool:
        return any(p.poll() not in (None, 0) for p in self.procs)

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.time() + timeout
        for p in self.procs:
            p.wait(timeout=None if deadline is None else max(0.0, deadline - time.time()))
        return self.returncode


def _agent_pids(proc) -> list[int]:
    return [p.pid for p in proc.procs] if isinstance(proc, _Agents) else [proc.pid]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start_agents(stage: str, stage_dir: Path, nproc: int, nodes: int, rank_module: str,
                  rank_args: list[str], python: str, env: dict) -> _Agents:
    """``nodes`` torchrun agents on this machine, each in its own session, logging to
    torchrun.node<k>.log; node 0 serves the rendezvous store (no race for the port)."""
    endpoint = f"localhost:{_free_port()}"
    rdzv_id = f"{stage}-{uuid.uuid4().hex[:12]}"
    procs: list[subprocess.Popen] = []
    try:
        for k in range(nodes):
            cmd = node_command(k, nodes, nproc // nodes, endpoint, rdzv_id, rank_args,
                               rank_module=rank_module, python=python, is_host=k == 0)
            with open(stage_dir / f"torchrun.node{k}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, env=env, cwd=REPO_ROOT))
    except BaseException:
        for p in procs:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        raise
    return _Agents(procs)


def _join_agent_logs(stage_dir: Path, nodes: int) -> None:
    """One torchrun.log, as failures.py parses it (ranks in torchrun's summaries are global)."""
    with open(stage_dir / "torchrun.log", "wb") as out:
        for k in range(nodes):
            out.write(f"===== torchrun agent node {k} =====\n".encode())
            try:
                out.write((stage_dir / f"torchrun.node{k}.log").read_bytes())
            except OSError:
                pass


def _tail(path: Path, n: int = 8000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace")


_SHUTDOWN = threading.Event()
_SIGNAL: list[str] = []  # the name of the signal that set _SHUTDOWN


def shutdown_signal() -> str | None:
    """The signal that stopped this controller (every stage tears down), or None."""
    return (_SIGNAL[0] if _SIGNAL else "shutdown") if _SHUTDOWN.is_set() else None


def _stop(signum: int) -> None:
    _SIGNAL.append(signal.Signals(signum).name)
    _SHUTDOWN.set()


def exit_cleanly_on_sigterm() -> None:
    """On the controller's SIGTERM (CI job cancel, ``timeout``) every running ``run_stage``, in
    any thread, tears its torchrun down at once, and the main thread exits (pytest). Ranks live
    in sessions of their own and would otherwise outlive a killed controller (seen: a pytest
    killed by ``timeout`` left an 8-rank probe running). Install from the main thread."""
    def on_sigterm(signum, frame):
        _stop(signum)
        sys.exit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)


def interrupt_on_signals() -> None:
    """The CLI's handling of Ctrl-C (SIGINT) and SIGTERM: every running stage tears down at
    once, no new stage starts, and the caller goes on to write partial results marked
    incomplete (harness/run/cells.py). A second signal stops waiting for that."""
    def on_signal(signum, frame):
        if _SHUTDOWN.is_set():
            raise KeyboardInterrupt
        _stop(signum)
        print(f"\n{signal.Signals(signum).name}: stopping every running stage; the cells so far "
              "are written as a partial results.json", file=sys.stderr, flush=True)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
