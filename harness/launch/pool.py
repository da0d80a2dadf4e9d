"""Warm rank pool, controller side: consecutive stages of one world size in one torchrun.

Why: a fresh torchrun per stage spends about half of a cpu-tier stage importing torch,
megatron-core and ModelOpt. ``HARNESS_STAGE_MODE=pool`` keeps one torchrun of N
ranks (harness/rank/serve.py) per key and hands it stage after stage. The fresh torchrun stays
the default and the reference. A pool stage is watched by the same code as a fresh one
(torchrun.supervise: error files, rank deaths, timeout with stack dumps, the shutdown signal)
and comes back as the same StageRun, so judging cannot tell the modes apart except by wall
time. Any failure, timeout or interrupt kills the pool's whole session; the next stage of that
key gets a new pool. Single node only: multi-node stages always run fresh.

Scheduling: a stage whose key has a warm pool (one that has run a stage) that is busy waits
for it rather than starting a new pool: a warm stage costs its own work (GPU host, make repro:
a load in about 8 s), a new pool the whole start and import (about 50 s). With no warm pool
of its key a stage starts one, so the first stages of a phase still start in parallel.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.jsonfile import write_json_atomic
from harness.paths import RunDir
from harness.tiers import STAGE_MODES, TIERS, StageMode, facts, on_cuda
from harness.launch.command import make_stage_dirs, new_stage_token, stage_env, start_torchrun
from harness.launch.signals import shutdown_signal
from harness.launch.teardown import end_session, kill_and_wait
from harness.launch.torchrun import StageRun, not_started, supervise

# Read by rank code at each stage: sent with every job, not part of a pool's key.
JOB_ENV = ("HARNESS_INJECT",)
# The controller's environment that a rank reads at start: a pool's key holds it.
_KEY_ENV_PREFIXES = ("HARNESS_", "TORCH_", "NCCL_", "CUDA_", "MOE_CKPT_", "OMP_", "PYTHONPATH")
_NOT_KEY = {*JOB_ENV, "HARNESS_STAGE_MODE", "HARNESS_STAGE_DIR", "HARNESS_STAGE", "HARNESS_STAGE_TOKEN",
            "HARNESS_STAGE_TIMEOUT_S"}
# Variables that change in a pytest worker between runs but mean nothing to a warm parent:
# pytest's name of the running test; the inductor cache directory torch writes back into the
# controller's environment the first time it asks (torch/_inductor/runtime/cache_dir_utils.py),
# the default a rank computes the same way.
UNKEYED_ENV = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
STOP_WAIT_S = 10.0  # a stopped pool's ranks leave in well under a second



def stage_mode(tier: str | None = None) -> str:
    """``HARNESS_STAGE_MODE`` (every tier), else the tier's default: ``pool`` (warm rank pools),
    ``fresh`` (one torchrun per stage, the reference) or ``fork`` (ranks forked from a warm
    parent, harness/launch/warm.py)."""
    mode = os.environ.get("HARNESS_STAGE_MODE") or (
        facts(tier).stage_mode if tier in TIERS else StageMode.FRESH)
    if mode not in STAGE_MODES:
        raise ValueError(f"HARNESS_STAGE_MODE={mode!r}: want one of {STAGE_MODES}")
    return mode


def key_environment(whole: bool = False) -> dict[str, str]:
    """The controller's variables a pool's key holds (those its ranks read at start); ``whole``:
    every variable but UNKEYED_ENV (a warm parent kept across runs, launch/warm.py)."""
    if whole:
        return {k: v for k, v in os.environ.items() if k not in UNKEYED_ENV}
    return {k: v for k, v in os.environ.items() if k.startswith(_KEY_ENV_PREFIXES)}


@dataclass(frozen=True)
class PoolKey:
    """Stages a pool may run: same world, tier, patch (the fix cannot be undone), backend,
    rank environment, and run directory (pools live in ``<root>/pools``)."""

    world: int
    tier: str
    patch: str
    backend: str
    root: str
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, world: int, tier: str, patch: str, backend: str, root: Path,
           extra_env: dict | None = None, whole_environment: bool = False) -> "PoolKey":
        env = key_environment(whole_environment)
        env.update({k: str(v) for k, v in (extra_env or {}).items()})
        return cls(world, tier, patch, backend, str(Path(root).resolve()),
                   tuple(sorted((k, v) for k, v in env.items() if k not in _NOT_KEY)))


class RankPool:
    """One torchrun of ``key.world`` ranks running ``harness.rank.serve`` in ``pool_dir``."""

    def __init__(self, key: PoolKey, pool_dir: Path, *, grace_s: float = 3.0,
                 pg_timeout_s: float | None = None, python: str = sys.executable):
        self.key, self.dir, self.grace_s = key, Path(pool_dir).resolve(), grace_s
        self.pg_timeout_s, self.python = pg_timeout_s, python
        self.proc = None
        self.seq = 0
        self.passed = 0  # stages run to the end on this pool: warm once > 0
        self.dead = False
        self.started_at: float | None = None

    def start(self) -> "RankPool":
        for sub in ("jobs", "done", "logs", "stacks", "errors"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        env = stage_env("pool", self.dir, 0, self.pg_timeout_s, dict(self.key.env))
        env.pop("HARNESS_STAGE_TIMEOUT_S")  # per job (serve.py arms its stack-dump timer)
        env.update(HARNESS_POOL_DIR=str(self.dir), HARNESS_POOL_OWNER=str(os.getpid()),
                   HARNESS_POOL_TIER=self.key.tier, HARNESS_POOL_PATCH=self.key.patch)
        self.started_at = time.time()
        self.proc = start_torchrun(self.key.world, "harness.rank.serve", [str(self.dir)],
                                   self.dir / "torchrun.log", env, self.python)
        return self

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    @property
    def warm(self) -> bool:
        return self.passed > 0 and not self.dead

    def run(self, spec_path: Path, stage: str, stage_dir: Path, timeout_s: float,
            job_env: dict | None = None) -> StageRun:
        """Run one stage on the pool; the pool is dead afterwards unless the stage passed."""
        stage_dir = Path(stage_dir).resolve()
        if shutdown_signal():
            return not_started(stage, stage_dir)
        make_stage_dirs(stage_dir)
        self.seq += 1
        seq = self.seq
        # the first stage's clock starts with torchrun, as a fresh stage's does
        t0 = self.started_at if seq == 1 else time.time()
        env = {k: (job_env or {}).get(k, os.environ.get(k)) for k in JOB_ENV}
        token = new_stage_token()
        write_json_atomic(self.dir / "jobs" / f"{seq}.json", {
            "seq": seq, "stage": stage, "spec": str(Path(spec_path).resolve()),
            "stage_dir": str(stage_dir), "deadline": t0 + timeout_s, "env": env, "token": token})
        done_files = [self.dir / "done" / f"{seq}.rank{r}" for r in range(self.key.world)]
        try:
            run = supervise(stage, stage_dir, self.proc, t0, timeout_s, self.grace_s,
                            world=self.key.world, token=token,
                            done=lambda: all(p.exists() for p in done_files),
                            before_collect=lambda: self._copy_log(stage_dir))
        except BaseException:
            self.kill()
            raise
        if not run.ok:
            self.dead = True  # supervise killed its session already
        else:
            self.passed += 1
        return run

    def _copy_log(self, stage_dir: Path) -> None:
        """torchrun's own output, where failures.py reads it for a fresh stage."""
        try:
            shutil.copyfile(self.dir / "torchrun.log", stage_dir / "torchrun.log")
        except OSError:
            (stage_dir / "torchrun.log").write_text("")

    def kill(self) -> list[int]:
        """Kill the pool's session, then any process that still has this pool in its
        environment (a rank torchrun left behind, a rank's Manager child)."""
        self.dead = True
        return kill_session(self.proc, self.dir)

    def close(self) -> list[int]:
        """Ask the ranks to leave (a ``stop`` job), kill whatever is left after STOP_WAIT_S."""
        if self.proc is None:
            return []
        if self.alive and not shutdown_signal():
            self.seq += 1
            write_json_atomic(self.dir / "jobs" / f"{self.seq}.json", {"seq": self.seq, "stop": True})
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except Exception:  # noqa: BLE001 - TimeoutExpired: killed below
                pass
        return self.kill()  # reaps the session (a rank's Manager child, a stuck rank)


class PoolSet:
    """Idle pools by key: a stage takes one (or starts one), gives it back when it passed.

    Off the cpu tier ranks hold GPU memory, so starting a pool first closes the idle ones of
    other keys there. ``close_all`` at the end of every run (run/cells.py) and at exit."""

    WAIT_POLL_S = 0.5  # a waiting stage checks for an interrupt this often

    def __init__(self):
        self._lock = threading.Condition()
        self._idle: dict[PoolKey, list[RankPool]] = {}
        self._busy: set[RankPool] = set()
        self.started = 0  # torchrun starts, for tests and the bench
        self.stages = 0
        self.waited = 0  # stages that waited for a busy warm pool

    def run(self, key: PoolKey, spec_path: Path, stage: str, stage_dir: Path, timeout_s: float,
            job_env: dict | None = None) -> StageRun:
        if shutdown_signal():
            return not_started(stage, Path(stage_dir).resolve())
        pool = self._take(key)
        if pool is None:  # interrupted while waiting for a busy pool
            return not_started(stage, Path(stage_dir).resolve())
        try:
            return pool.run(spec_path, stage, stage_dir, timeout_s, job_env)
        finally:
            self._give_back(pool)

    def _take(self, key: PoolKey) -> RankPool | None:
        stale = []
        with self._lock:
            self.stages += 1
            waited = False
            while not any(p.alive for p in self._idle.get(key, [])) and any(
                    p.key == key and p.warm for p in self._busy):
                if shutdown_signal():
                    return None
                if not waited:
                    self.waited, waited = self.waited + 1, True
                self._lock.wait(self.WAIT_POLL_S)
            idle = self._idle.get(key, [])
            alive = [p for p in idle if p.alive]
            pool = alive[0] if alive else None
            stale = [p for p in idle if not p.alive]  # other idle pools of the key stay idle
            self._idle[key] = alive[1:]
            if pool is None and on_cuda(key.tier):
                stale += [p for k, ps in self._idle.items() for p in ps]
                self._idle = {}
            if pool is None:
                pool = self._new_pool(key)
            self._busy.add(pool)
        for p in stale:
            p.close()
        if pool.proc is None:
            try:
                pool.start()
            except BaseException:
                self._give_back(pool)
                raise
        return pool

    def _new_pool(self, key: PoolKey) -> RankPool:
        """A pool in a directory no other pool gets, whatever process asks: pytest-xdist workers
        share one run directory, each with a PoolSet counting from 1 (two workers once ran
        their stages on one pool directory, and a stage whose jobs another pool's ranks
        answered passed with 0 ranks)."""
        self.started += 1
        stem = f"w{key.world}-{key.tier}-{key.patch}-p{os.getpid()}-{self.started}"
        return RankPool(key, RunDir(Path(key.root)).new_pool(stem))

    def prestart(self, keys: list[PoolKey]) -> None:
        """Start one pool per entry of ``keys`` now (a key listed twice gets two), idle until a
        stage takes it: its torchrun start and imports (rank/serve.py ``preload``) overlap
        whatever the controller does meanwhile. Closes no idle pool of another key, unlike a
        pool a stage starts off the cpu tier: the caller asks for exactly the pools its next
        stages take (make repro's save wave, run/repro.py). The first stage's clock still
        starts with the pool's torchrun."""
        for key in keys:
            with self._lock:
                pool = self._new_pool(key)
            pool.start()
            self._give_back(pool)

    def idle_shapes(self) -> set[tuple[str, str, str, int]]:
        """(tier, patch, backend, world) of every live idle pool: run/cells.py starts a phase
        with the stages that can use one, before others start pools (and, off the cpu tier,
        close idle pools of other keys)."""
        with self._lock:
            return {(k.tier, k.patch, k.backend, k.world)
                    for k, ps in self._idle.items() if any(p.alive for p in ps)}

    def _give_back(self, pool: RankPool) -> None:
        with self._lock:
            self._busy.discard(pool)
            if pool.alive:
                self._idle.setdefault(pool.key, []).append(pool)
            self._lock.notify_all()

    def close_all(self) -> None:
        """Close every pool, idle or (after an interrupt) still busy; nothing is left running."""
        with self._lock:
            pools = [p for ps in self._idle.values() for p in ps] + list(self._busy)
            self._idle = {}
        # each waits up to STOP_WAIT_S for its ranks to leave: side by side (make repro ends
        # with two or three 8-rank pools); one by one where no thread can start (at exit)
        threads = [threading.Thread(target=p.close, name=f"close-{p.dir.name}") for p in pools]
        started = []
        for t in threads:
            try:
                t.start()
                started.append(t)
            except RuntimeError:
                break
        for t in started:
            t.join()
        for p in pools[len(started):]:
            p.close()


def processes_where(env_matches, *, zombies: bool = False) -> list[psutil.Process]:
    """Processes but this one whose environment ``env_matches`` (a dict -> bool): the harness
    marks every process it starts by a directory in its environment (HARNESS_POOL_DIR,
    HARNESS_STAGE_DIR), and this is the one scan that finds them."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and env_matches(p.environ()) \
                    and (zombies or p.status() != psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.Error:
            continue
    return out


def kill_session(proc, directory: Path) -> list[int]:
    """Kill ``proc``'s session, then every process that still carries ``directory`` in its
    environment (a rank torchrun left behind, an agent, a Manager child): the one way a pool or
    a warm parent (launch/warm.py) is killed. Returns the pids it killed."""
    left = end_session(proc, grace_s=0.0) if proc is not None else []
    strays = pool_processes(directory)
    kill_and_wait(strays)
    return sorted({*left, *(p.pid for p in strays)})


def pool_processes(pool_dir: Path) -> list[psutil.Process]:
    """Live processes started for the pool in ``pool_dir`` (it is in their environment)."""
    return processes_where(lambda env: env.get("HARNESS_POOL_DIR") == str(pool_dir))


POOLS = PoolSet()
atexit.register(POOLS.close_all)
