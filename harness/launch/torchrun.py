"""Controller side: run one stage as its own torchrun, watch it, tear it down in bounded time.

Why: the first failing rank must be named, the fallout on its peers labelled, and nothing may
outlive the stage. The controller polls the stage directory (error files from rank_guard) and
the rank processes (psutil); after the first failure it gives torchrun a short grace to tear
down by itself, then kills the whole session. On timeout it first asks ranks for stack dumps.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from harness.jsonfile import read_json
from harness.launch import failures as F
from harness.launch.command import make_stage_dirs, new_stage_token, stage_env, start_torchrun
from harness.launch.nodes import Agents, join_agent_logs, start_agents
from harness.launch.signals import SHUTDOWN, shutdown_signal
from harness.launch.teardown import (POLL_S, Watch, agent_pids, alive, discover, kill_session,
                                     reap_leftovers)
from harness.records import CauseKind, StageCause, StageResult

DUMP_SETTLE_S = 0.1  # after a stack dump file grew: faulthandler's last lines
# The final kill's SIGTERM grace, after the tier's grace ran out: a rank that takes the SIGTERM
# writes its own error file, a label. Once a primary error is on file, the peers' files add
# nothing, and a rank blocked in a C++ collective (NCCL) takes no Python signal anyway: NCCL
# ranks sharing the H100 sat out the whole second, 1.93-2.07 s from first failure to all gone at
# world 8 against the 2 s goal (docs/runs/20261206-0758-device-session.md).
TERM_GRACE_S = 1.0
CAUSE_KNOWN_TERM_GRACE_S = 0.2


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
    amax_kinds: dict | None = None  # a save: the kinds its ranks' calibration made (calibrated_kinds)

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
            interrupted=self.interrupted, amax_kinds=self.amax_kinds,
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
    if SHUTDOWN.is_set():  # the run was interrupted: start nothing new
        return not_started(stage, stage_dir)
    make_stage_dirs(stage_dir)
    t0 = time.time()
    token = new_stage_token()
    env = stage_env(stage, stage_dir, timeout_s, pg_timeout_s, env, token)
    if nodes > 1:
        proc = start_agents(stage, stage_dir, nproc, nodes, rank_module, rank_args, python, env)
    else:
        proc = start_torchrun(nproc, rank_module, rank_args, stage_dir / "torchrun.log", env, python)
    after = (lambda: join_agent_logs(stage_dir, nodes)) if nodes > 1 else None
    return supervise(stage, stage_dir, proc, t0, timeout_s, grace_s, world=nproc, token=token,
                     before_collect=after)


def not_started(stage: str, stage_dir: Path) -> StageRun:
    """The record of a stage the interrupted controller did not start."""
    return StageRun(stage=stage, ok=False, returncode=None, wall_s=0.0, timed_out=False,
                    cause=None, secondaries=[], rank_results={}, stage_dir=stage_dir,
                    teardown_s=None, leftovers=[], interrupted=shutdown_signal())


def supervise(stage: str, stage_dir: Path, proc, t0: float, timeout_s: float, grace_s: float, *,
              world: int, token: str, done: Callable[[], bool] | None = None,
              before_collect: Callable[[], None] | None = None) -> StageRun:
    """Watch one stage of ``proc`` to its end and build its StageRun.

    Without ``done`` the stage ends with torchrun, which is then torn down. With ``done`` (a
    warm rank pool, harness/launch/pool.py) it also ends when ``done()`` says every rank has
    finished; a clean such end leaves torchrun running, anything else kills its session.
    The stage passes only when each of its ``world`` ranks reported a result stamped with
    ``token`` (fail closed: an exit code of 0 or a set of done files is no evidence).
    """
    w = Watch()
    timed_out = finished = False
    try:
        timed_out = _watch(proc, stage_dir, w, t0, timeout_s, grace_s, done)
        finished = (done is not None and not timed_out and w.first_failure_at is None
                    and proc.poll() is None and done())
    finally:
        if not finished:
            kill_session(proc, w, grace_s=0.0 if timed_out else term_grace_s(stage_dir))
    all_gone = time.time()
    leftovers = [] if finished else reap_leftovers(agent_pids(proc), w)
    if before_collect:
        before_collect()
    return _collect(stage, stage_dir, proc, w, t0, all_gone, timed_out and not w.interrupted,
                    leftovers, returncode=0 if finished else proc.returncode, world=world, token=token)


def term_grace_s(stage_dir: Path) -> float:
    """The final kill's SIGTERM grace: CAUSE_KNOWN_TERM_GRACE_S once a rank has filed a primary
    error (one no SECONDARY pattern matches, harness/launch/failures.py), else TERM_GRACE_S."""
    errors = _read_jsons(stage_dir / "errors").values()
    known = any(F.secondary_reason(str(e.get("message", "")), str(e.get("exc_type", ""))) is None
                for e in errors)
    return CAUSE_KNOWN_TERM_GRACE_S if known else TERM_GRACE_S


def _watch(proc: subprocess.Popen, stage_dir: Path, w: Watch, t0: float, timeout_s: float,
           grace_s: float, done: Callable[[], bool] | None = None) -> bool:
    """Poll until torchrun exits (or ``done()``); True when the stage timed out."""
    errors_dir = stage_dir / "errors"
    while proc.poll() is None and not (done is not None and done()):
        now = time.time()
        discover(proc, w)
        _note_deaths(stage_dir, w, now)
        if w.first_failure_at is None and any(errors_dir.glob("rank*.json")):
            w.first_failure_at = _earliest_error_time(errors_dir) or now
        if w.first_failure_at is None and isinstance(proc, Agents) and proc.failed():
            w.first_failure_at = now  # one node gave up: the others would wait in rendezvous
        if w.first_failure_at is not None and now - max(w.first_failure_at, t0) > grace_s:
            return False  # torchrun did not finish tearing down: the caller kills the session
        if SHUTDOWN.is_set():  # interrupted: no stack dump, tear down at once
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


def _note_deaths(stage_dir: Path, w: Watch, now: float) -> None:
    for r in w.ranks.values():
        if r.died_at is None and not alive(r.proc):
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


def _dump_stacks(stage_dir: Path, w: Watch, wait_s: float = 2.0) -> None:
    """SIGUSR1 each live rank whose guard installed the handler (its stacks file names its pid;
    without the handler SIGUSR1 would kill it), then wait until every dump has landed (its file
    grew; faulthandler writes one in one go), at most ``wait_s``: a fixed wait made every
    timed-out stage's teardown 2 s long (measured on NCCL, docs/runs/20261206-0758-device-session.md)."""
    sent: dict[Path, int] = {}
    for r in w.ranks.values():
        path = stage_dir / "stacks" / f"rank{r.rank}.txt"
        try:
            text = path.read_text()
            if text.split("\n", 1)[0] == f"pid {r.pid}" and alive(r.proc):
                r.proc.send_signal(signal.SIGUSR1)
                sent[path] = len(text.encode())
        except (OSError, psutil.Error):
            continue
    if not sent:
        return
    end = time.time() + wait_s
    while sent and time.time() < end:
        sent = {p: n for p, n in sent.items() if _size(p) <= n}
        if sent:
            time.sleep(POLL_S)
    if not sent:
        time.sleep(DUMP_SETTLE_S)  # the last dump's final lines


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def rank_results(stage_dir: Path, world: int, token: str) -> dict[int, dict]:
    """The results this stage's ranks wrote: rank r of ``world``, stamped with ``token``
    (harness/rank/guard.py write_result). A file of another stage, another controller or an
    earlier use of the directory does not count."""
    return {r: doc for r, doc in _read_jsons(stage_dir / "ranks").items()
            if 0 <= r < world and doc.get("stage_token") == token}


def calibrated_kinds(stage_dir: Path, world: int, token: str) -> dict | None:
    """The amax kinds per module family that this stage's ranks recorded once calibration ended
    (harness/rank/stages.py ``record_kinds``), merged over the ranks (each holds its own layers
    and experts); None when no rank got there. Written before the save, so a failed save has them."""
    docs = [doc for r, doc in _read_jsons(stage_dir / "kinds").items()
            if 0 <= r < world and doc.get("stage_token") == token and isinstance(doc.get("amax_kinds"), dict)]
    if not docs:
        return None
    merged: dict[str, set] = {}
    for doc in docs:
        for family, kinds in doc["amax_kinds"].items():
            merged.setdefault(family, set()).update(kinds)
    return {family: sorted(kinds) for family, kinds in sorted(merged.items())}


def no_result_cause(stage: str, stage_dir: Path, world: int, results: dict[int, dict],
                    returncode: int | None) -> F.RankFailure:
    """The cause of a stage that ended without an error but without every rank's result."""
    missing = [r for r in range(world) if r not in results]
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    return F.RankFailure(
        rank=missing[0], stage=stage, kind=CauseKind.NO_RESULT, exc_type="NoRankResult",
        message=(f"{len(missing)} of {world} ranks reported no result for this stage (rank "
                 f"{shown}; torchrun exit {returncode}): nothing shows they ran it; see "
                 f"{stage_dir}/ranks and torchrun.log"))


def _collect(stage: str, stage_dir: Path, proc: subprocess.Popen, w: Watch, t0: float,
             all_gone: float, timed_out: bool, leftovers: list[int], returncode: int | None,
             world: int, token: str) -> StageRun:
    results = rank_results(stage_dir, world, token)
    errors = list(_read_jsons(stage_dir / "errors").values())
    # a forked stage that ends before its agent starts (a stage timeout of a millisecond, a rank
    # that cannot import torch) leaves no torchrun.log: no table to parse, not a crash here
    tr_log = _tail(stage_dir / "torchrun.log", n=None)
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
    if not failed and len(results) < world:  # fail closed: every rank must show it ran
        failed, cause = True, no_result_cause(stage, stage_dir, world, results, returncode)
    if classify and cause is None and not tr_log:  # a reason, never a bare FAILED
        cause = F.RankFailure(
            rank=0, stage=stage, kind=CauseKind.TIMEOUT if timed_out else CauseKind.EXIT,
            exc_type="NoTorchrunLog",
            message=(f"the stage ended ({'timed out' if timed_out else f'exit {returncode}'}) "
                     f"before its launcher wrote {stage_dir}/torchrun.log: no rank ran it"))
    first = w.first_failure_at
    if first is None and failed:
        first = min((f.time for f in [cause, *secondaries] if f and f.time), default=None)
    return StageRun(
        stage=stage, ok=not failed, returncode=returncode, wall_s=all_gone - t0,
        timed_out=timed_out, cause=cause, secondaries=secondaries, rank_results=results,
        stage_dir=stage_dir, teardown_s=(all_gone - first) if first else None, leftovers=leftovers,
        first_failure_at=first, all_gone_at=all_gone, interrupted=w.interrupted,
        rank_nodes={r.rank: r.node for r in w.ranks.values()}, started_at=t0,
        amax_kinds=calibrated_kinds(stage_dir, world, token),
    )


def _tail(path: Path, n: int | None = 8000) -> str:
    """The last ``n`` bytes of ``path`` as text (all of it when ``n`` is None); "" if unreadable."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return (data if n is None else data[-n:]).decode(errors="replace")
