"""Failure injection at named points of a stage, driven by ``HARNESS_INJECT``.

Why: the teardown and attribution logic must be tested against the failures it exists for,
on real torchrun jobs, without needing the checkpoint bug itself.

``HARNESS_INJECT="kind:rank:point[,kind:rank:point...]"``; ``rank`` is a global rank or ``*``.
What each kind does, and what it produces on gloo (measured, see tests/test_teardown.py):

- ``raise``: ``RuntimeError("injected failure ...")`` on that rank. The guard writes its error
  file and exits 1; peers blocked in the next collective get gloo ``Connection closed by peer``
  / ``Connection reset by peer`` (secondary) or are SIGTERMed by torchrun.
- ``sigkill``: the rank SIGKILLs itself: no error file, exit code -9 in torchrun's
  ``Failures:`` block; peers see ``Connection closed by peer`` or torchrun's SIGTERM.
- ``abort``: the rank dies of SIGABRT (``os.abort()``, what a C++ abort or a failed assert in a
  native library does): no error file, exit code -6, as ``sigkill`` otherwise.
- ``hang``: the rank sleeps forever outside any collective. Peers time out in their next
  collective after the process-group timeout (gloo: ``Timed out waiting ...ms for recv``),
  then torchrun SIGTERMs the sleeper.
- ``mismatch``: the rank enters an all_reduce the others do not expect (a tensor of a
  different size). Gloo notices the size mismatch on a receiving peer (an ``enforce fail``
  about ``op.preamble.length``) or, if nobody is in a matching collective, the job times out;
  either way the peers' errors come first and name the wrong rank, which is the point:
  it shows what attribution can and cannot do.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

KINDS = ("raise", "sigkill", "abort", "hang", "mismatch")


@dataclass(frozen=True)
class Injection:
    kind: str
    rank: str  # "*" or a global rank
    point: str

    def matches(self, rank: int, point: str) -> bool:
        return self.point == point and self.rank in ("*", str(rank))


def parse(spec: str | None) -> list[Injection]:
    """Parse ``kind:rank:point`` items; reject unknown kinds early (at the controller)."""
    out = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in KINDS:
            raise ValueError(f"bad HARNESS_INJECT item {item!r}: want kind:rank:point, kind in {KINDS}")
        out.append(Injection(*parts))
    return out


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def point(name: str) -> None:
    """Called by stage code at a named point; does what ``HARNESS_INJECT`` asks for this rank."""
    rank = _rank()
    for inj in parse(os.environ.get("HARNESS_INJECT")):
        if inj.matches(rank, name):
            _fire(inj, rank)


def _fire(inj: Injection, rank: int) -> None:
    print(f"[inject] {inj.kind} on rank {rank} at {inj.point} t={time.time():.3f}", flush=True)
    if inj.kind == "raise":
        raise RuntimeError(f"injected failure at {inj.point} on rank {rank}")
    if inj.kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if inj.kind == "abort":
        os.abort()
    if inj.kind == "hang":
        while True:
            time.sleep(3600)
    if inj.kind == "mismatch":
        _mismatched_collective()


def _mismatched_collective() -> None:
    """An all_reduce of a size no peer uses, so the ranks' collectives no longer line up."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1031))
