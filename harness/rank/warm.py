"""Warm parent, rank side: ``python -m harness.rank.warm <dir>`` (HARNESS_STAGE_MODE=fork).

Why: a fresh torchrun spends most of a cpu-tier stage importing torch, megatron-core and
ModelOpt. This process imports them once (the tier's ``fork_preload``: harness/tiers.py), stays
single-threaded, and for each stage forks a *stage agent* that runs torch's own elastic
launcher (``elastic_launch``, what torchrun runs) with ``start_method="fork"``: the ranks are
forked from the warm image, under torch's agent, rendezvous and per-rank error files, and
each runs ``python -m <rank_module> <args>`` as a fresh rank would (``runpy``), under
rank/guard.py with the same files in its stage directory. The agent is a session of its own,
so the controller (harness/launch/warm.py) watches and tears it down exactly like a torchrun;
a stage's failure never reaches this process, which serves the next stage.

Files under <dir>: the controller writes ``jobs/<seq>.json`` ({seq, stage, stage_dir, nproc,
rank_module, rank_args, env, rdzv_endpoint}, or {seq, stop}); this process writes ``ready.json`` after its
preload, ``started/<seq>.json`` ({pid} of the stage agent) and, once it reaped the agent,
``exit/<seq>.json`` ({returncode}, negative: the signal, as Popen). The agent's output (torch
elastic's log, the failure table failures.py parses) goes to ``<stage_dir>/torchrun.log``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

# Imported here, in the parent, not lazily: the stage agent's exit-watching thread uses guard
# while the agent forks ranks, and a rank forked while that thread held guard's import lock
# hangs at its own import of guard (CI, 2026-12-07: a 2-rank stage timed out after 60 s).
from harness.rank import fork_store, guard, inject
from harness.rank.guard import stack_file_pids

POLL_S = 0.02
# torch.cuda.is_available() asks NVML, not the CUDA runtime, so a later fork is not poisoned
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
OWNER_CHECK_S = 1.0
# torchrun's default: how often the elastic agent looks at its ranks
MONITOR_INTERVAL_S = 0.1


def _write(path: Path, doc: dict) -> None:
    from harness.jsonfile import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)


def preload(tier: str, patch: str) -> dict:
    """Import the tier's ``fork_preload`` (harness/tiers.py) and say whether this image may be
    forked: no CUDA context, no thread but this one (a fork copies only the calling thread;
    a lock another thread held stays locked in every child). A failing import is only noted,
    as in a warm pool (rank/serve.py): each stage's ranks import again and fail as that stage."""
    import importlib

    from harness.rank.setup import import_stack
    from harness.tiers import facts

    began, failed, refusal = time.time(), None, None
    modules = facts(tier).fork_preload
    try:
        if modules is None:
            import_stack(tier, patch)
        for name in modules or ():
            importlib.import_module(name)
            if refusal := fork_refusal():  # the module that made it so
                refusal = f"after importing {name}: {refusal}"
                break
    except Exception:  # noqa: BLE001 - the first stage's ranks import again
        failed = traceback.format_exc()
        print(f"[warm] preload failed; each stage's ranks import again:\n{failed}",
              file=sys.stderr, flush=True)
    return {"pid": os.getpid(), "preload_s": round(time.time() - began, 3),
            "preload_failed": failed, "refuses_fork": refusal or fork_refusal(),
            "threads": native_threads()}


def fork_refusal() -> str | None:
    """Why this process must not fork ranks, or None: CUDA initialized (a forked child cannot
    use it), or a Python thread besides this one (a fork copies only the calling thread; a lock
    another held stays locked in every child). Native threads are only counted (``threads``
    in ready.json): on the cpu tier importing torch starts one and numpy's BLAS another, thread
    pools that torch's own fork-based workers (DataLoader, torch.multiprocessing) inherit too."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialized after the preload (a forked rank could not use it)"
    if torch is not None and child_in_bad_fork():
        return ("a forked child is in torch's bad-fork state (the CUDA runtime was touched, e.g. "
                "by torch.cuda.is_available(), without CUDA being initialized): its first CUDA "
                "call raises 'Cannot re-initialize CUDA in forked subprocess'")
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate()]
        return f"Python threads after the preload: {names} (a forked child would miss them)"
    return None


PROBE_WAIT_S = 10.0  # a forked probe child reads one flag and exits


def child_in_bad_fork() -> bool:
    """Whether a child forked now would be in torch's bad-fork state. torch poisons forks once
    the CUDA runtime is asked anything (torch/csrc/cuda/Module.cpp ``poison_fork``, e.g. in
    ``_cuda_getDeviceCount`` behind ``torch.cuda.is_available()``) while ``is_initialized()``
    stays False: on the GPU host (H100, 2026-12-06) the preload of torch, Transformer Engine and
    megatron-core did so and every forked rank failed. Only a forked child can tell: one is
    forked here, answers by its exit code, and is reaped (killed after PROBE_WAIT_S, and then
    counted as poisoned: a fork that cannot even answer is no place for ranks)."""
    pid = os.fork()
    if pid == 0:  # the child: no cleanup, no atexit, only the answer
        bad = sys.modules["torch"].cuda._is_in_bad_fork()
        os._exit(1 if bad else 0)
    deadline = time.time() + PROBE_WAIT_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.time() > deadline:  # a probe that does not answer: killed, the fork refused
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.01)
    return os.waitstatus_to_exitcode(done[1]) == 1


def native_threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def rank_entry(rank_module: str, rank_args: list[str]) -> None:
    """One forked rank: what ``python -m rank_module *rank_args`` runs, once every rank of the
    stage is forked (rank/fork_store.py: a rank forked beside the store's resolver call would
    hang). A rank that passes returns (torch's agent waits for the entry point's return value)
    instead of os._exit(0)."""
    import runpy

    stage_dir, rank = guard.current_stage_dir(), int(os.environ["RANK"])

    def first_step() -> None:
        inject.point("forked")  # before this rank says it began (tests: a child stuck there)
        fork_store.wait_for_sibling_forks(stage_dir, os.environ["TORCHELASTIC_RUN_ID"],
                                          int(os.environ["LOCAL_RANK"]),
                                          int(os.environ["LOCAL_WORLD_SIZE"]))

    guard.guarded(os.environ.get("HARNESS_STAGE", "stage"), rank, stage_dir, first_step)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):  # not the agent's handlers:
        signal.signal(sig, signal.SIG_DFL)  # a SIGTERM ends a fresh rank (after its stack dump)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and "torch" in sys.modules:  # torch read it when the parent imported it:
        sys.modules["torch"].set_num_threads(int(threads))  # as a fresh rank's import would
    guard.RETURN_ON_SUCCESS = True
    sys.argv = [rank_module, *rank_args]
    try:
        runpy.run_module(rank_module, run_name="__main__", alter_sys=True)
    except guard.Returned:
        pass


def agent(job: dict, refusal: str | None) -> None:
    """The forked stage agent: a session of its own, torch's elastic launcher, then exit."""
    os.setsid()
    stage_dir = Path(job["stage_dir"])
    fd = os.open(stage_dir / "torchrun.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    code = 1
    try:
        if refusal:
            raise RuntimeError(f"the warm parent refuses to fork ranks: {refusal}")
        os.environ.clear()
        os.environ.update(job["env"])
        threading.Thread(target=report_exits, args=(stage_dir,), daemon=True,
                         name="warm-rank-exits").start()
        code = launch(job)
    except BaseException:  # noqa: BLE001 - said in torchrun.log, the stage fails
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def report_exits(stage_dir: Path) -> None:
    """Print each rank that exits non-zero as a block of torchrun's failure table (the stage
    agent's thread). torch's agent names only the first failure it observed among forked ranks
    (its table for ranks it started as subprocesses names every one); failures.py reads each
    rank's exit code, a SIGKILL or SIGABRT among them, from these blocks. ``waitid`` with
    WNOWAIT sees a rank's exit the moment it dies and leaves reaping it to torch. It imports
    nothing (see the imports at the top)."""
    seen: set[int] = set()
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            time.sleep(POLL_S)  # no child yet (or none left)
            continue
        if info is None or info.si_pid in seen:
            time.sleep(0.005)  # a zombie torch has not reaped yet
            continue
        seen.add(info.si_pid)
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        if code == 0:
            continue
        rank = stack_file_pids(stage_dir / "stacks").get(info.si_pid)
        if rank is not None:
            print(f"[warm] rank exit seen by the stage agent:\n[{rank}]:\n  rank      : {rank} "
                  f"(local_rank: {rank})\n  exitcode  : {code} (pid: {info.si_pid})",
                  file=sys.stderr, flush=True)


def launch(job: dict) -> int:
    """torch's elastic launcher, as torchrun's own ``run`` calls it: one node, the job's ranks
    forked from this process, no restart. On a failure it prints torchrun's failure table
    (ChildFailedError), which failures.py reads. Rendezvous: torch's static one on the port the
    controller picked (``rdzv_endpoint``), its server on the IPv4 loopback (rank/fork_store.py:
    no 5 s reverse-DNS stall per client). Not c10d, torchrun's: its dynamic rendezvous records
    each event with ``inspect.stack()``, whose module lookup walks sys.modules on every frame,
    about 1 s per stage in this image of a few thousand modules (0.1 s in torchrun's small one)."""
    import uuid

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    stage_dir = Path(job["stage_dir"])
    if "OMP_NUM_THREADS" not in os.environ and int(job["nproc"]) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # what torchrun's own run.py sets (config_from_args)
    with cuda_asked_through_nvml():
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=int(job["nproc"]), run_id=uuid.uuid4().hex,
            rdzv_backend=fork_store.register(), rdzv_endpoint=job["rdzv_endpoint"],
            rdzv_configs={"rank": 0},
            max_restarts=0,
            monitor_interval=MONITOR_INTERVAL_S, start_method="fork",
            logs_specs=DefaultLogsSpecs(log_dir=str(stage_dir / "elastic")))
    if cuda_compiled() and child_in_bad_fork():
        raise RuntimeError("the stage agent touched the CUDA runtime before forking its ranks: "
                           "each would fail with 'Cannot re-initialize CUDA in forked subprocess'")
    try:
        elastic_launch(config, rank_entry)(job["rank_module"], list(job["rank_args"]))
    except ChildFailedError as e:
        print(f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n{e}",
              file=sys.stderr, flush=True)
        return 1
    return 0


@contextlib.contextmanager
def cuda_asked_through_nvml():
    """torch's LaunchConfig asks ``torch.cuda.is_available()`` (its NUMA defaults,
    torch/distributed/launcher/api.py ``__post_init__``). Asked through the CUDA runtime, that
    poisons every later fork (torch/csrc/cuda/Module.cpp ``poison_fork``): on the H100 host
    (2026-12-07) all 8 forked ranks of each stage failed in ``torch.cuda.set_device`` with
    'Cannot re-initialize CUDA in forked subprocess', the agent's environment being the
    stage's, without the parent's PYTORCH_NVML_BASED_CUDA_CHECK. Set for that call only: the
    ranks keep the stage's environment, as a fresh torchrun's do."""
    before = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before


def cuda_compiled() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda._is_compiled()


def _owner_alive() -> bool:
    owner = int(os.environ.get("HARNESS_POOL_OWNER", "0"))
    try:
        owner and os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Parent:
    """The loop: fork an agent per job, reap agents, stop when asked or the controller is gone."""

    def __init__(self, root: Path, refusal: str | None):
        self.root, self.refusal = root, refusal
        self.agents: dict[int, int] = {}  # pid -> seq

    def reap(self) -> None:
        while self.agents:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            seq = self.agents.pop(pid, None)
            if seq is not None:
                code = os.waitstatus_to_exitcode(status)
                _write(self.root / "exit" / f"{seq}.json", {"returncode": code, "time": time.time()})

    def stop(self, why: str) -> None:
        """Kill every agent still running (its session: the agent and its ranks), then leave."""
        print(f"[warm] stop: {why}", flush=True)
        for pid in list(self.agents):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + 5
        while self.agents and time.time() < deadline:
            self.reap()
            time.sleep(POLL_S)
        sys.stdout.flush()
        os._exit(0)

    def serve(self) -> None:
        seq, checked = 1, time.monotonic()
        while True:
            path = self.root / "jobs" / f"{seq}.json"
            while not path.exists():  # written atomically: there means complete
                self.reap()
                time.sleep(POLL_S)
                if time.monotonic() - checked > OWNER_CHECK_S:
                    checked = time.monotonic()
                    if not _owner_alive():
                        self.stop("controller gone")
            job = json.loads(path.read_text())
            if job.get("stop"):
                self.stop("asked")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                agent(job, self.refusal)  # never returns
            self.agents[pid] = seq
            _write(self.root / "started" / f"{seq}.json", {"pid": pid, "time": time.time()})
            seq += 1


def main(argv: list[str]) -> None:
    from harness.rank import trim

    trim.install()  # before anything imports the stack
    from harness.rank.stages import configure_warnings

    configure_warnings()
    root = Path(argv[0]).resolve()
    ready = preload(os.environ["HARNESS_POOL_TIER"], os.environ["HARNESS_POOL_PATCH"])
    _write(root / "ready.json", ready)
    if ready["refuses_fork"]:
        print(f"[warm] refuses to fork: {ready['refuses_fork']}", file=sys.stderr, flush=True)
    Parent(root, ready["refuses_fork"]).serve()


if __name__ == "__main__":  # a rank's spawn Manager (torch_dist save) re-imports __main__
    main(sys.argv[1:])
