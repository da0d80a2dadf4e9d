"""Warm parents, controller side: ``HARNESS_STAGE_MODE=fork``.

Why: most of a cpu-tier stage is importing the stack. A warm parent (harness/rank/warm.py)
imports it once per key and forks, per stage, a stage agent running torch's own elastic
launcher with ``start_method="fork"``: the ranks start from the warm image under torch's
agent, rendezvous and error files, with no launcher of ours. Unlike a warm pool, every stage
gets new rank processes (nothing a stage leaves in a rank reaches the next) of any world size,
and one parent serves stages side by side.

The controller never forks (it is multi-threaded): the parent is a subprocess of its own
session, and each stage agent a session of its own. ``ForkedAgent`` makes that agent look
like torchrun's Popen to ``torchrun.supervise``, so a stage is watched and torn down by the same
code as a fresh one (error files, rank deaths, timeout with stack dumps, the shutdown signal,
the session kill) and returns the same StageRun. A stage's failure kills its agent's session,
never the parent; a parent that dies or has not forked a stage's agent by the stage's end is
killed and replaced. Parents live in ``<run>/pools/fork-...`` and carry ``HARNESS_POOL_DIR`` like
a pool's ranks, so the same search finds every process of theirs. A controller that runs many
short runs (a pytest worker: conftest.py) may keep its parents across runs instead
(``WarmParents.keep_across_runs``). A parent whose preload leaves
forks unusable (ready.json ``refuses_fork``: the GPU host's stack, docs/benchmarks.md) has its
stages run as fresh torchrun instead.
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from harness.jsonfile import read_json, write_json_atomic
from harness.launch.command import make_stage_dirs, new_stage_token, stage_env
from harness.launch.nodes import rendezvous_port
from harness.launch.pool import STOP_WAIT_S, PoolKey, kill_session
from harness.launch.signals import shutdown_signal
from harness.launch.teardown import POLL_S
from harness.launch.torchrun import StageRun, not_started, run_stage, supervise
from harness.paths import REPO_ROOT, RunDir
from harness.rank.guard import stack_file_pids
from harness.rank.warm import NVML_CHECK
from harness.tiers import facts


def parent_key(tier: str, patch: str, backend: str, root: Path, extra_env: dict | None = None) -> PoolKey:
    """A warm parent's key: a pool's (harness/launch/pool.py) without the world size, which
    each stage's agent picks."""
    return PoolKey.of(0, tier, patch, backend, root, extra_env)


class ForkedAgent:
    """A stage agent the warm parent forked, watched like a torchrun Popen: ``pid`` once the
    parent says it forked it, ``returncode`` once the parent reaped it (both from files)."""

    def __init__(self, parent: "WarmParent", seq: int, stage_dir: Path):
        self.parent, self.seq, self.stage_dir = parent, seq, stage_dir
        self.pid: int | None = None
        self.returncode: int | None = None
        self._ranks: dict[int, int] = {}  # pid -> rank

    @property
    def procs(self) -> list["ForkedAgent"]:
        """What teardown.agent_pids signals: nothing before the agent exists."""
        return [self] if self.pid is not None else []

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.pid is None:
            self.pid = (read_json(self.parent.dir / "started" / f"{self.seq}.json", default=None)
                        or {}).get("pid")
        done = read_json(self.parent.dir / "exit" / f"{self.seq}.json", default=None)
        if done is not None:
            self.returncode = int(done["returncode"])
        elif not self.parent.alive and not self._agent_alive():
            self.returncode = 1  # the parent died: nobody forked or reaped this agent
        return self.returncode

    def _agent_alive(self) -> bool:
        try:
            return self.pid is not None and psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def wait(self, timeout: float | None = None) -> int | None:
        """As Popen.wait. An agent not forked yet (its parent still preloading) cannot be
        signalled: the parent is killed instead, so it never starts one after the stage ended."""
        if self.poll() is None and self.pid is None:
            self.parent.kill()
        end = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if end is not None and time.time() > end:
                raise subprocess.TimeoutExpired(f"stage agent {self.pid}", timeout)
            time.sleep(POLL_S)
        return self.returncode

    def rank_of(self, pid: int) -> int | None:
        """The rank of the agent's child ``pid``. A forked rank's environment as /proc shows it is
        the parent's (no RANK): its guard's stack-dump file names its pid (rank/guard.py)."""
        if pid not in self._ranks:
            self._ranks.update(stack_file_pids(self.stage_dir / "stacks"))
        return self._ranks.get(pid)


class WarmParent:
    """One ``python -m harness.rank.warm`` process in ``dir``; hands it stages as job files."""

    def __init__(self, key: PoolKey, parent_dir: Path, *, pg_timeout_s: float | None = None,
                 python: str = sys.executable):
        self.key, self.dir = key, Path(parent_dir).resolve()
        self.pg_timeout_s, self.python = pg_timeout_s, python
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self._seq = 0
        self._lock = threading.Lock()

    def start(self) -> "WarmParent":
        for sub in ("jobs", "started", "exit"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        env = stage_env("warm", self.dir, 0, self.pg_timeout_s, dict(self.key.env))
        env.pop("HARNESS_STAGE_TIMEOUT_S")
        env.update(self.marks(), HARNESS_POOL_OWNER=str(os.getpid()),
                   HARNESS_POOL_TIER=self.key.tier, HARNESS_POOL_PATCH=self.key.patch)
        if facts(self.key.tier).cuda:
            # torch.cuda.is_available() asks the CUDA runtime (and poisons every later fork:
            # torch/csrc/cuda/Module.cpp poison_fork) unless told to ask NVML; the GPU tiers'
            # preload calls it (the H100 host, 2026-12-06: forked ranks could not use CUDA)
            env.setdefault(NVML_CHECK, "1")  # its stage agents set it for themselves too
        self.started_at = time.time()
        with open(self.dir / "parent.log", "wb") as log:
            self.proc = subprocess.Popen([self.python, "-m", "harness.rank.warm", str(self.dir)],
                                         stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=REPO_ROOT)
        return self

    def marks(self) -> dict[str, str]:
        """In the environment of the parent and every stage's ranks (and what they exec): found
        by launch/pool.py ``pool_processes``, as a pool's ranks are."""
        return {"HARNESS_POOL_DIR": str(self.dir)}

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def ready(self) -> dict | None:
        """The parent's ready.json (its preload time, whether it refuses to fork), once written."""
        return read_json(self.dir / "ready.json", default=None)

    def refusal(self, wait_s: float) -> str | None:
        """Why the parent refuses to fork ranks (ready.json), waiting up to ``wait_s`` for its
        preload; None: it forks, or it died or is not ready by then (the stage then finds out)."""
        deadline = time.time() + wait_s
        while self.ready is None and self.alive and time.time() < deadline and not shutdown_signal():
            time.sleep(POLL_S)
        return (self.ready or {}).get("refuses_fork")

    def run(self, stage: str, stage_dir: Path, nproc: int, rank_args: list[str], timeout_s: float,
            env: dict | None = None, *, rank_module: str = "harness.rank", grace_s: float = 3.0,
            pg_timeout_s: float | None = None, waited: bool = False) -> StageRun:
        """As torchrun.run_stage, with the ranks forked from this parent. A stage that starts
        before the parent is ready (or ``waited`` for it) is clocked from the parent's start (it
        waited for the imports)."""
        stage_dir = Path(stage_dir).resolve()
        if shutdown_signal():
            return not_started(stage, stage_dir)
        make_stage_dirs(stage_dir)
        t0 = self.started_at if waited or not self.ready else time.time()
        token = new_stage_token()
        job_env = {**stage_env(stage, stage_dir, timeout_s, pg_timeout_s, env, token), **self.marks()}
        with self._lock:
            self._seq += 1
            seq = self._seq
            write_json_atomic(self.dir / "jobs" / f"{seq}.json", {
                "seq": seq, "stage": stage, "stage_dir": str(stage_dir), "nproc": nproc,
                "rank_module": rank_module, "rank_args": list(rank_args), "env": job_env,
                "rdzv_endpoint": f"localhost:{rendezvous_port()}"})
        agent = ForkedAgent(self, seq, stage_dir)
        try:
            return supervise(stage, stage_dir, agent, t0, timeout_s, grace_s, world=nproc, token=token)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> list[int]:
        """Kill the parent, then every process that carries its directory (agents, ranks)."""
        return kill_session(self.proc, self.dir)

    def close(self) -> list[int]:
        """Ask the parent to stop (it kills any agent still running), kill what is left."""
        if self.alive and not shutdown_signal():
            with self._lock:
                self._seq += 1
                write_json_atomic(self.dir / "jobs" / f"{self._seq}.json", {"seq": self._seq, "stop": True})
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()


class WarmParents:
    """A live warm parent per key, started by the first stage that needs it; closed at the end
    of every run (``end_run``, run/cells.py) unless kept across runs, and at exit."""

    def __init__(self):
        self._lock = threading.Lock()
        self._parents: dict[PoolKey, WarmParent] = {}
        self._told: set[Path] = set()  # parents whose refusal to fork was printed
        self._kept: set[WarmParent] = set()
        self.kept_in: Path | None = None
        self.started = 0

    def keep_across_runs(self, directory: Path | None) -> None:
        """From now on, parents live in ``directory`` and serve every later run whose key matches
        but for its root, until ``close_all``: a pytest worker (conftest.py) runs dozens of short
        runs, each of which would otherwise pay a parent's imports (6-10 core-seconds on the cpu
        tier). None: a parent per run, in its pools directory (the CLI's, always)."""
        self.kept_in = None if directory is None else Path(directory).resolve()

    def _kept_key(self, key: PoolKey) -> PoolKey:
        """``key`` for a parent kept across runs: no run's root, and the whole environment.
        Within a run the controller's environment holds still, so key_environment's prefixes
        are enough; across a worker's tests any variable the preload reads at import
        (PYTORCH_*, KMP_*, PYTHON*, ...) may differ, and the parent must not outlive it."""
        return PoolKey.of(key.world, key.tier, key.patch, key.backend, self.kept_in,
                          dict(key.env), whole_environment=True)  # the run's rank env wins

    def get(self, key: PoolKey) -> WarmParent:
        dead = None
        if self.kept_in is not None:
            key = self._kept_key(key)
        with self._lock:
            parent = self._parents.get(key)
            if parent is None or not parent.alive:
                dead = parent
                self._kept.discard(dead)
                self.started += 1
                stem = f"fork-{key.tier}-{key.patch}-p{os.getpid()}-{self.started}"
                parent = WarmParent(key, RunDir(Path(key.root)).new_pool(stem)).start()
                self._parents[key] = parent
                if self.kept_in is not None:
                    self._kept.add(parent)
        if dead is not None:
            dead.kill()
        return parent

    def kept(self) -> list[WarmParent]:
        """The parents kept across runs, live or not."""
        with self._lock:
            return list(self._kept)

    def run(self, key: PoolKey, stage: str, stage_dir: Path, nproc: int, rank_args: list[str],
            timeout_s: float, env: dict | None = None, **kw) -> StageRun:
        """The stage with ranks forked from the key's parent; where that parent refuses to fork
        (its preload touched CUDA: the GPU tiers, docs/benchmarks.md), with fresh torchrun, the
        refusal printed once per parent."""
        if shutdown_signal():
            return not_started(stage, Path(stage_dir).resolve())
        parent = self.get(key)
        waited = parent.ready is None
        refusal = parent.refusal(wait_s=timeout_s)
        if refusal:
            if parent.dir not in self._told:
                self._told.add(parent.dir)
                print(f"[warm] {parent.dir.name}: {refusal}; its stages start fresh torchrun "
                      "ranks instead", file=sys.stderr, flush=True)
            return run_stage(stage, stage_dir, nproc, rank_args, timeout_s, env, **kw)
        return parent.run(stage, stage_dir, nproc, rank_args, timeout_s, env, waited=waited, **kw)

    def end_run(self) -> None:
        """A run's end: its parents never outlive it, but those kept across runs."""
        self._close(lambda p: p not in self._kept)

    def close_all(self) -> None:
        self._close(lambda p: True)

    def _close(self, which) -> None:
        with self._lock:
            parents = [p for p in self._parents.values() if which(p)]
            self._parents = {k: p for k, p in self._parents.items() if p not in parents}
            self._kept.difference_update(parents)
        for p in parents:
            p.close()


WARM = WarmParents()
atexit.register(WARM.close_all)

