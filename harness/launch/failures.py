"""Name the first primary failure of a stage and label the rest secondary.

Why: one failing rank makes every peer fail too (gloo/NCCL connection errors, collective
timeouts, torchrun's SIGTERM). Torch elastic's "Root Cause" is unreliable: it stamps ranks
without an error file with the time it parsed them. Here the cause is the earliest PRIMARY
failure by the time the rank itself recorded (or the controller saw it die).
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from harness.check.keys import failing_key
from harness.records import CauseKind

# Texts that mean "a peer went away / the job is being torn down", not a cause of its own.
SECONDARY_PATTERNS: list[tuple[str, re.Pattern]] = [
    # NCCL >= 2.2x via ProcessGroupNCCL, as in the bug report: "ncclRemoteError: remote process exited prematurely"
    ("nccl-remote", re.compile(r"ncclRemoteError|remote process exited")),
    # torch c10d exception type raised for backend (NCCL/gloo) failures
    ("dist-backend", re.compile(r"\bDistBackendError\b|\bDistNetworkError\b")),
    # gloo transport/tcp/pair.cc when the peer's socket closes (findings.md, rank 1 of 2)
    ("gloo-closed", re.compile(r"Connection closed by peer")),
    # gloo pair.cc "Read error ...: Connection reset by peer"; also ECONNRESET from the TCPStore
    ("conn-reset", re.compile(r"Connection reset by peer")),
    # EPIPE writing to a dead peer (gloo pair.cc write, TCPStore)
    ("broken-pipe", re.compile(r"Broken pipe")),
    # gloo transport/tcp/unbound_buffer.cc: "Timed out waiting 10000ms for recv operation to complete"
    ("gloo-timeout", re.compile(r"Timed out waiting \d+ms for (recv|send) operation")),
    # ProcessGroupNCCL watchdog: "Watchdog caught collective operation timeout: WorkNCCL(...)"
    ("nccl-watchdog", re.compile(r"Watchdog caught collective operation timeout|watchdog.*time(d)? ?out", re.I)),
    # ProcessGroupNCCL after abort / TORCH_NCCL_ASYNC_ERROR_HANDLING tore the communicator down
    ("nccl-aborted", re.compile(r"NCCL communicator was aborted|communicator.*aborted|ncclInternalError: .*abort", re.I)),
    # torch elastic's own text for a rank it SIGTERMed during teardown
    ("elastic-sigterm", re.compile(r"Signal 15 \(SIGTERM\) received")),
]

# Exception types that are secondary whatever their message says (torch.distributed errors).
SECONDARY_EXC_TYPES = re.compile(r"(^|\.)(DistBackendError|DistNetworkError)$")

# torch elastic ChildFailedError block (torch/distributed/elastic/multiprocessing/errors):
#   "  rank      : 1 (local_rank: 1)" then "  exitcode  : -9 (pid: 7708)"
ELASTIC_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank", re.M)
ELASTIC_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.M)
# torch elastic multiprocessing/api.py: "Sending process 7418 closing signal SIGTERM" (ranks it
# started as subprocesses); for forked ranks (fork mode, harness/rank/warm.py) "Closing process
# 7418 via signal SIGTERM", and torch.multiprocessing's "Terminating process 7418 via signal SIGTERM"
ELASTIC_SIGTERM = re.compile(r"(?:Sending|Closing|Terminating) process (\d+) (?:closing|via) signal (SIG\w+)")
# C++ std::terminate text (gloo EnforceNotMet in a background thread -> SIGABRT): "  what():  [enforce fail ..."
CPP_WHAT = re.compile(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.*)")
# A frame inside a collective in a faulthandler dump: the rank was waiting on peers, not stuck itself.
IN_COLLECTIVE = re.compile(r"torch/distributed/(distributed_c10d|c10d_logger)\.py")
# A frame of the rank guard's failure path (harness/rank/guard.py): the rank had raised and was
# writing its error file when the teardown signal came, so it was not the one its peers waited
# for. Once, on a loaded machine, a lower-numbered peer was named instead of the hung rank with
# its stack "outside any collective"; a peer caught here is the one way the program allows that
# (not reproduced in 6 tries since, so not shown to be that case).
REPORTING_ITS_ERROR = re.compile(r'harness/rank/guard\.py", line \d+ in (fail|error_record)\b')
# The first line of every rank's stacks file (harness/rank/guard.py _arm_stack_dumps): not a dump.
STACKS_PID_LINE = re.compile(r"\Apid \d+\n?")
# A frame of torch's extension build lock (torch/utils/file_baton.py FileBaton.wait): the rank
# waits for another process to build a CUDA extension (ModelOpt's modelopt_cuda_ext_fp8). A build
# killed mid-way leaves the lock file, and then every later load waits forever (seen on the H100,
# 20261206; harness/launch/extensions.py).
WAITING_ON_BUILD_LOCK = re.compile(r'torch/utils/file_baton\.py", line \d+ in wait\b')
BUILD_LOCK_HINT = ("waiting on torch's extension build lock (torch/utils/file_baton.py): another "
                   "process builds a CUDA extension, or a build killed earlier left its 'lock' file "
                   "in the TORCH_EXTENSIONS_DIR build directory (remove it)")
# ModelOpt's check after max calibration (modelopt/torch/quantization/model_calib.py
# _check_moe_calibration_complete): one all_gather_object per leaf quantizer and per data, expert
# and tensor parallel group. With 1041 quantizers over NCCL's socket transport, 8-16 ranks on one
# GPU, it outlived a 300 s stage timeout with every rank in it (H100, 20261206; docs/findings.md).
IN_CALIBRATION_CHECK = re.compile(r'modelopt/torch/quantization/model_calib\.py", line \d+ in '
                                  r"_check_moe_calibration_complete\b")
SLOW_CALIBRATION_CHECK_HINT = ("every rank in ModelOpt's calibration check (model_calib.py "
                               "_check_moe_calibration_complete, one all_gather_object per quantizer "
                               "and parallel group): still calibrating, not deadlocked; slow with many "
                               "experts over NCCL's socket transport (raise the scenario's stage_timeout_s)")


# Primary failures of several ranks recorded within this many seconds of the earliest are
# simultaneous: which rank wrote first is scheduling noise (seen on the H200: the unpatched load
# of a checkpoint saved without validation fails on rank 0 in validate_sharding_integrity and on
# rank 1 in the DCP load plan for the same missing key, 1-3 ms apart, in either order), so the
# lowest rank among them is the cause. A peer's fallout is secondary by its text, not by time.
SIMULTANEOUS_S = 0.1


@dataclass
class RankFailure:
    rank: int
    stage: str
    kind: str  # a CauseKind
    exc_type: str
    message: str
    traceback: str = ""
    time: float | None = None
    secondary: bool = False
    key: str | None = None

    def first_line(self) -> str:
        return (self.message.strip().splitlines() or [""])[0][:200]

    def line(self) -> str:
        s = f"rank {self.rank} [{self.stage}] {self.kind}: {self.exc_type}: {self.first_line()}"
        return s + (f" (key {self.key})" if self.key else "")


@dataclass
class RankExit:
    """What the controller knows about one rank that left no result file."""

    rank: int
    pid: int | None = None
    exitcode: int | None = None  # from torchrun's Failures block; None when it printed none
    died_at: float | None = None  # first poll that saw it gone; None when still alive at teardown
    signalled: bool = False  # torchrun or the controller sent it a signal during teardown
    log_tail: str = ""
    stack: str = ""


def secondary_reason(text: str, exc_type: str = "") -> str | None:
    """Name of the secondary pattern that ``text`` matches, or None if it looks primary."""
    if exc_type and SECONDARY_EXC_TYPES.search(exc_type):
        return "dist-error-type"
    for name, rx in SECONDARY_PATTERNS:
        if rx.search(text or ""):
            return name
    return None


def _waited_on_peer(text: str) -> bool:
    """Does ``text`` say its rank lost or timed out on a peer? By the texts only: the
    exception-type names (DistBackendError) also carry primary faults."""
    return any(rx.search(text or "") for name, rx in SECONDARY_PATTERNS if name != "dist-backend")


def parse_elastic_failures(text: str) -> dict[int, tuple[int, int]]:
    """rank -> (exitcode, pid) from torchrun's Failures/Root Cause block (times ignored)."""
    out: dict[int, tuple[int, int]] = {}
    for block in re.split(r"^\s*\[\d+\]:\s*$", text, flags=re.M)[1:]:
        r, e = ELASTIC_RANK.search(block), ELASTIC_EXIT.search(block)
        if r and e:
            out[int(r.group(1))] = (int(e.group(1)), int(e.group(2)))
    return out


def parse_elastic_signalled(text: str) -> set[int]:
    """Pids torchrun itself signalled while tearing the job down."""
    return {int(m.group(1)) for m in ELASTIC_SIGTERM.finditer(text)}


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def in_collective(stack: str) -> bool:
    return bool(IN_COLLECTIVE.search(stack or ""))


def _waiting_or_reporting(stack: str) -> bool:
    """The dump shows a rank in a collective, or reporting its own error: not a stuck rank."""
    return in_collective(stack) or bool(REPORTING_ITS_ERROR.search(stack or ""))


def _from_error(stage: str, e: dict) -> RankFailure:
    msg, tb = str(e.get("message", "")), str(e.get("traceback", ""))
    exc = str(e.get("exc_type", "Exception"))
    return RankFailure(
        rank=int(e["rank"]), stage=str(e.get("stage", stage)), kind=CauseKind.EXCEPTION, exc_type=exc,
        message=msg, traceback=tb, time=e.get("time"),
        secondary=secondary_reason(msg, exc) is not None, key=failing_key(msg) or failing_key(tb),
    )


def _from_exit(stage: str, x: RankExit, timed_out: bool) -> RankFailure:
    what = CPP_WHAT.search(x.log_tail or "")
    if x.exitcode is not None and x.exitcode < 0:
        sig = _signal_name(-x.exitcode)
        msg = f"died by {sig}" + (f": {what.group(2)}" if what else "")
        exc = what.group(1) if what else sig
        # torchrun/controller teardown signals are fallout; a signal nobody sent (injected
        # SIGKILL, OOM killer, SIGABRT from std::terminate) is a cause of its own, unless the
        # rank says it was waiting on a peer: NCCL's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=3)
        # takes a rank whose collective timed out down by SIGABRT, "Process group watchdog
        # thread terminated with exception: [Rank 1] Watchdog caught collective operation
        # timeout" (seen on the H100, 20261206: a hung rank's peers were named the cause).
        # A CUDA fault reaches the same terminate (c10::DistBackendError too) with its own text
        # and stays a cause: the exception's type says nothing here, only its text does.
        sec = x.signalled or _waited_on_peer(what.group(2) if what else x.log_tail)
        return RankFailure(x.rank, stage, CauseKind.SIGNAL, exc, msg, x.stack, x.died_at, sec, failing_key(msg))
    if x.exitcode is not None and x.exitcode > 0:
        msg = f"exit code {x.exitcode} without an error file" + (f": {what.group(2)}" if what else "")
        sec = secondary_reason(x.log_tail) is not None
        return RankFailure(x.rank, stage, CauseKind.EXIT, CauseKind.EXIT, msg, x.log_tail[-2000:], x.died_at, sec)
    kind = CauseKind.TIMEOUT if timed_out else CauseKind.HANG
    msg = "still running at the stage timeout" if timed_out else "alive, outside any error, when peers failed"
    return RankFailure(x.rank, stage, kind, kind, msg, x.stack, x.died_at, True)


def classify(
    stage: str,
    errors: list[dict],
    exits: list[RankExit],
    *,
    timed_out: bool = False,
) -> tuple[RankFailure | None, list[RankFailure]]:
    """(cause, secondaries). ``errors``: the ranks' error files; ``exits``: ranks that failed
    without one (or were still alive at teardown). The cause is the earliest primary failure;
    without any, a rank that was stuck outside a collective while its peers timed out (hang),
    else the earliest failure of all. Primaries within SIMULTANEOUS_S of the earliest tie, and
    the lowest rank among them wins."""
    have_error = {int(e["rank"]) for e in errors}
    failures = [_from_error(stage, e) for e in errors]
    failures += [_from_exit(stage, x, timed_out) for x in exits if x.rank not in have_error]
    if not failures:
        return None, []
    far = float("inf")
    primaries = sorted((f for f in failures if not f.secondary), key=lambda f: (f.time or far, f.rank))
    cause = _first_primary(primaries) if primaries else (
        _stuck_rank(failures, exits, timed_out) or _odd_call_site(failures))
    if cause is None:
        cause = min(failures, key=lambda f: (f.time or far, f.rank))
    cause.secondary = False
    rest = [f for f in failures if f is not cause]
    for f in rest:
        f.secondary = True
    return cause, sorted(rest, key=lambda f: (f.time or far, f.rank))


def _first_primary(primaries: list[RankFailure]) -> RankFailure:
    """The lowest rank among the primaries within SIMULTANEOUS_S of the earliest (``primaries``
    sorted by time, untimed last)."""
    first = primaries[0]
    if first.time is None:
        return first
    return min((f for f in primaries if f.time is not None and f.time - first.time <= SIMULTANEOUS_S),
               key=lambda f: f.rank)


# A traceback frame, e.g. '  File "/x/harness/rank/inject.py", line 91, in _mismatched_collective'
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def call_site(tb: str) -> str | None:
    """The innermost frame outside torch: which collective call of the program a rank was in."""
    frames = [m.groups() for m in _FRAME.finditer(tb or "") if "/torch/" not in m.group(1)]
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else None


def _odd_call_site(failures: list[RankFailure]) -> RankFailure | None:
    """Every rank timed out in a collective: the one rank whose call site differs from all the
    others entered a collective they never joined (a mismatch)."""
    sites: dict[str, list[RankFailure]] = {}
    for f in failures:
        if f.kind == CauseKind.EXCEPTION and (site := call_site(f.traceback)):
            sites.setdefault(site, []).append(f)
    if len(sites) != 2:
        return None
    odd, common = sorted(sites.values(), key=len)
    if len(odd) != 1 or len(common) < 2:
        return None
    f = odd[0]
    f.message = f"collective mismatch: only this rank was at {call_site(f.traceback)}; {f.message}"
    return f


def _dump(stack: str) -> str:
    """A rank's stacks file without the guard's first line, ``pid <n>`` (harness/rank/guard.py
    _arm_stack_dumps, written at start): the faulthandler dump, or "" when none was written."""
    return STACKS_PID_LINE.sub("", stack or "", count=1)


def _stuck_rank(failures: list[RankFailure], exits: list[RankExit], timed_out: bool) -> RankFailure | None:
    """A rank killed in teardown (or alive at timeout) with no error of its own, preferring one
    whose stack dump shows it outside any collective: that rank is what its peers waited for.
    Never a rank that gave up on a peer itself: one a signal nobody sent took down, whose text
    says it waited on or lost a peer (its NCCL watchdog's SIGABRT)."""
    stacks = {x.rank: _dump(x.stack) for x in exits}
    unsent = {x.rank for x in exits if not x.signalled}
    # An aborted peer has no dump (SIGABRT has no handler), only its stacks file's pid line. That
    # line once counted as a dump "outside any collective", so a lower-numbered aborted peer was
    # named instead of the hung rank: the H100 bench's hang named right 1 of 2 (20261206 11:40);
    # since this, named right at rank 0 and at the last rank of worlds 2, 4, 8 (14:14-14:20).
    gave_up = {f.rank for f in failures if f.kind == CauseKind.SIGNAL and f.rank in unsent and f.secondary}
    killed = [f for f in failures if f.kind in (CauseKind.SIGNAL, CauseKind.HANG, CauseKind.TIMEOUT)
              and f.rank not in gave_up]
    if not killed:
        return None
    killed.sort(key=lambda f: (_waiting_or_reporting(stacks.get(f.rank, "")), not stacks.get(f.rank), f.rank))
    f = killed[0]
    if not _waiting_or_reporting(stacks.get(f.rank, "")):
        f.kind = f.exc_type = CauseKind.TIMEOUT if timed_out else CauseKind.HANG
        f.message = f"{f.message}; stuck outside any collective while peers waited"
    if WAITING_ON_BUILD_LOCK.search(stacks.get(f.rank, "")):
        f.message = f"{f.message}; {BUILD_LOCK_HINT}"
    dumps = [s for s in stacks.values() if s]
    if timed_out and dumps and all(IN_CALIBRATION_CHECK.search(s) for s in dumps):
        f.message = f"{f.message}; {SLOW_CALIBRATION_CHECK_HINT}"
    # peers gave up on it by an error of their own, or by a signal the teardown did not send
    # (their NCCL watchdog's abort)
    errs = [g.time for g in failures if g is not f and g.time
            and (g.kind == CauseKind.EXCEPTION or (g.kind == CauseKind.SIGNAL and g.rank in unsent))]
    if errs and (f.time is None or f.time > min(errs)):
        f.time = min(errs)  # it was stuck at least since its peers gave up on it
    return f
