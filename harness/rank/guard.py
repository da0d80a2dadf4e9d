"""Rank-side guard: one rank of a stage reports success or its first error, then leaves at once.

Why: when one rank raises, its peers are blocked in the next collective. A rank that calls
``destroy_process_group`` there can hang forever, and torch elastic stamps ranks without an
error file with the time it parsed them, so the real cause gets lost. The guard writes an
elastic-style error file with the time of the exception, aborts the process group, and
``os._exit(1)``s, so the controller sees the first failure and tears the job down in bounded time.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn

from harness.jsonfile import write_json_atomic

STACK_DUMP_LEAD_S = 5.0  # dump stacks this long before the controller's hard limit


def pg_timeout_s() -> float:
    """Process-group timeout the controller chose (seconds, default 60; harness/switches.py)."""
    from harness.switches import number

    return number("HARNESS_PG_TIMEOUT_S")


def nccl_env(trace_buffer: int = 2000) -> dict[str, str]:
    """NCCL settings that turn a stuck collective into an error plus a flight-recorder dump."""
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    # torch 2.13 renamed the flight-recorder size (and warns on the old name in every rank log)
    buf = "TORCH_FR_BUFFER_SIZE" if (major, minor) >= (2, 13) else "TORCH_NCCL_TRACE_BUFFER_SIZE"
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",  # on error/timeout: abort comms, skip CUDA cleanup
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        buf: str(trace_buffer),
    }


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def current_stage_dir() -> Path:
    return Path(os.environ.get("HARNESS_STAGE_DIR", "."))


def _redirect_output(log: Path) -> None:
    """Point fds 1 and 2 at the rank log, so C++ output (gloo, NCCL, faulthandler) lands there too."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def _arm_stack_dumps(rank: int, stacks_dir: Path | None = None, limit_s: float | None = None) -> None:
    """SIGUSR1 and SIGTERM -> stack dump; also dump shortly before the controller's hard limit.

    The file starts with ``pid <n>``: its existence tells the controller the handler is in
    place (SIGUSR1 would otherwise kill the rank) and which pid to signal. Re-arming (the warm
    pool, harness/rank/serve.py, once per stage) points the handlers at the new file, cancels
    the previous timer and closes the previous file.
    """
    path = (stacks_dir or current_stage_dir() / "stacks") / f"rank{rank}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "w", buffering=1)  # kept open until the next re-arm (or the process ends)
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    faulthandler.cancel_dump_traceback_later()
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    # torchrun's teardown SIGTERM: dump where we were, then die by SIGTERM as before (chain)
    faulthandler.register(signal.SIGTERM, file=f, all_threads=True, chain=True)
    if limit_s is None and os.environ.get("HARNESS_STAGE_TIMEOUT_S"):
        limit_s = float(os.environ["HARNESS_STAGE_TIMEOUT_S"])
    if limit_s:
        faulthandler.dump_traceback_later(max(1.0, limit_s - STACK_DUMP_LEAD_S), repeat=False, file=f)
    previous = getattr(_arm_stack_dumps, "file", None)
    _arm_stack_dumps.file = f  # keep a reference so it is not closed
    if previous is not None:
        previous.close()


def stack_file_pids(stacks_dir: Path) -> dict[int, int]:
    """pid -> rank of every stack-dump file in ``stacks_dir`` (its first line, written above)."""
    out = {}
    for path in stacks_dir.glob("rank*.txt"):
        try:
            with open(path) as f:
                head = f.readline().split()
            if head[:1] == ["pid"]:
                out[int(head[1])] = int(path.stem[4:])
        except (OSError, ValueError, IndexError):
            continue
    return out


# How long a failing rank waits for its abort before it leaves anyway: an NCCL communicator
# whose peers sit in a collective may not finish aborting (the process exits regardless).
ABORT_BOUND_S = 0.5


def abort_process_group(bound_s: float = ABORT_BOUND_S) -> None:
    """Abort (never destroy) every process group: peers may sit in a collective. Bounded: the
    abort runs in a daemon thread this rank stops waiting for after ``bound_s``."""
    import threading

    def abort() -> None:
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            from torch.distributed import distributed_c10d as c10d

            c10d._abort_process_group()  # torch 2.13 has no public abort; this aborts all groups
        except Exception as e:  # noqa: BLE001 - we exit right after; just leave a trace
            print(f"[rank_guard] abort failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    worker = threading.Thread(target=abort, name="rank-guard-abort", daemon=True)
    worker.start()
    worker.join(bound_s)
    if worker.is_alive():
        print(f"[rank_guard] abort still running after {bound_s} s; leaving without it",
              file=sys.stderr, flush=True)


def destroy_process_group() -> None:
    """The clean end of a rank whose peers all finished too (no collective is pending)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def error_record(stage: str, rank: int, exc: BaseException) -> dict:
    t = type(exc)
    return {
        "rank": rank,
        "stage": stage,
        "time": time.time(),
        "exc_type": f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "pid": os.getpid(),
    }


def enter_stage(rank: int, stage_dir: Path, limit_s: float | None = None) -> None:
    """Point this rank's output and stack dumps at ``stage_dir`` (once per stage)."""
    _redirect_output(stage_dir / "logs" / f"rank{rank}.log")
    _arm_stack_dumps(rank, stage_dir / "stacks", limit_s)
    for k, v in nccl_env().items():  # harmless on gloo; read when an NCCL group is built
        os.environ.setdefault(k, v)


def fail(stage: str, rank: int, stage_dir: Path, exc: BaseException) -> NoReturn:
    """This rank's error file (time of the exception), then abort every group and leave."""
    rec = error_record(stage, rank, exc)
    try:
        write_json_atomic(stage_dir / "errors" / f"rank{rank}.json", rec)
    finally:
        print(rec["traceback"], file=sys.stderr, flush=True)
        abort_process_group()
        os._exit(1)


def guarded(stage: str, rank: int, stage_dir: Path, fn: Callable[[], Any]) -> Any:
    """``fn()``; any exception (SystemExit and KeyboardInterrupt too) is this rank's failure."""
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - recorded, then the process leaves
        fail(stage, rank, stage_dir, exc)


def write_result(rank: int, stage_dir: Path, result: dict | None) -> None:
    """The rank's figures, stamped with the time it wrote them (the rest of the stage wall is
    its exit: run/cell.py ``_note_stage``) and with the stage's token, without which the
    controller does not count it (harness/launch/torchrun.py ``rank_results``)."""
    write_json_atomic(stage_dir / "ranks" / f"rank{rank}.json",
                      {**(result or {}), "result_written_at": time.time(),
                       "stage_token": os.environ.get("HARNESS_STAGE_TOKEN", "")})


# Set in a rank forked by torch's elastic agent (harness/rank/warm.py rank_entry): that agent
# waits for its entry point's return value, so a rank that passed returns (raising Returned up
# to the entry point) instead of os._exit(0); a failing rank still leaves at once.
RETURN_ON_SUCCESS = False


class Returned(BaseException):
    """A passing rank's way back to its fork-mode entry point (``leave(0)``)."""


def leave(code: int = 0) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0 and RETURN_ON_SUCCESS:
        raise Returned
    os._exit(code)


def rank_main(stage: str, body: Callable[[], dict]) -> NoReturn:
    """Run one rank's stage body under the guard; never returns."""
    rank = _rank()
    sd = current_stage_dir()
    enter_stage(rank, sd)
    result = guarded(stage, rank, sd, body)
    # a failing teardown is still this rank's error
    guarded(stage, rank, sd, lambda: (write_result(rank, sd, result), destroy_process_group()))
    leave(0)
