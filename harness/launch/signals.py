"""Controller side: the signals that stop a run (Ctrl-C, a CI cancel, ``timeout``).

Why: ranks live in sessions of their own and would outlive a killed controller; on a signal
every running stage, in any thread, tears down at once and no new stage starts.
"""
from __future__ import annotations

import signal
import sys
import threading
import time

SHUTDOWN = threading.Event()
# GNU ``timeout`` signals its command and then its whole process group, so the controller gets
# the same SIGTERM twice at once (seen on the H200: the second one, taken for "stop waiting",
# lost a sampled run's partial results.json). A repeat this soon is that same stop.
REPEAT_WINDOW_S = 1.0
_FIRST_AT: list[float] = []


_SIGNAL: list[str] = []  # the name of the signal that set SHUTDOWN


def shutdown_signal() -> str | None:
    """The signal that stopped this controller (every stage tears down), or None."""
    return (_SIGNAL[0] if _SIGNAL else "shutdown") if SHUTDOWN.is_set() else None


def _stop(signum: int) -> None:
    _SIGNAL.append(signal.Signals(signum).name)
    _FIRST_AT.append(time.monotonic())
    SHUTDOWN.set()


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
    incomplete (harness/run/cells.py). A second signal, later than REPEAT_WINDOW_S after the
    first, stops waiting for that."""
    def on_signal(signum, frame):
        if SHUTDOWN.is_set():
            if _FIRST_AT and time.monotonic() - _FIRST_AT[0] < REPEAT_WINDOW_S:
                return  # the same stop, delivered twice (``timeout``: to us, then our group)
            raise KeyboardInterrupt
        _stop(signum)
        print(f"\n{signal.Signals(signum).name}: stopping every running stage; the cells so far "
              "are written as a partial results.json", file=sys.stderr, flush=True)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)


def stopped_code(rc: int) -> int:
    """A command's exit code ``rc``, or 128+N when signal N stopped the run, even one that came
    after its last cell: the stop was asked for and a caller (make, CI) must see it, not an exit
    0 after the "stopping every running stage" line."""
    name = shutdown_signal()
    if rc >= 128 or name not in signal.Signals.__members__:
        return rc
    code = 128 + signal.Signals[name].value
    print(f"stopped by {name}: exit {code} (results.json holds every cell that finished)",
          file=sys.stderr)
    return code
