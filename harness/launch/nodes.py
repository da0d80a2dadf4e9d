"""Controller side: one stage as several torchrun agents joined by a c10d rendezvous (the
multi-node launch, run on one machine here; docs/multinode.md).

Why: a multi-node stage must be watched and torn down like one torchrun: ``Agents`` looks like
one Popen to the watcher, and every agent lives in a session of its own.
"""
from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from harness.launch.teardown import signal_group
from harness.paths import REPO_ROOT


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


class Agents:
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


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low(default: int = 32768) -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def rendezvous_port(attempts: int = 64) -> int:
    """A free port below the kernel's ephemeral range, for a store another process will bind.

    Why: a port from ``bind(0)`` is free only until the socket closes; any process's next
    outgoing connection or ``bind(0)`` (gloo's listeners, a parallel test) can take it before
    torchrun binds it (EADDRINUSE, seen once in a clean clone's ``make test``). The kernel
    never hands out ports below the ephemeral range by itself, so only another explicit choice
    can collide there, and the random pick makes that rare; each candidate is checked free.
    """
    low = _ephemeral_low()
    span = range(max(1024, low - 12288), max(1025, low))
    for _ in range(attempts):
        port = random.choice(span)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("localhost", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:  # everything below the range is taken: fall back to the kernel
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_agents(stage: str, stage_dir: Path, nproc: int, nodes: int, rank_module: str,
                  rank_args: list[str], python: str, env: dict) -> Agents:
    """``nodes`` torchrun agents on this machine, each in its own session, logging to
    torchrun.node<k>.log; node 0 serves the rendezvous store (no race for the port)."""
    endpoint = f"localhost:{rendezvous_port()}"
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
            signal_group(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        raise
    return Agents(procs)


def join_agent_logs(stage_dir: Path, nodes: int) -> None:
    """One torchrun.log, as failures.py parses it (ranks in torchrun's summaries are global)."""
    with open(stage_dir / "torchrun.log", "wb") as out:
        for k in range(nodes):
            out.write(f"===== torchrun agent node {k} =====\n".encode())
            try:
                out.write((stage_dir / f"torchrun.node{k}.log").read_bytes())
            except OSError:
                pass
