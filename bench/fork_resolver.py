"""A process that hosts a TCPStore server and forks clients: how many children hang.

    python bench/fork_resolver.py [--rounds 10] [--children 4]

What the fork-mode stage agent does (harness/rank/fork_store.py says why it matters): torch's
store server names each client it accepts with a resolver call in its own thread, and a child
forked while that call holds glibc's resolver lock hangs at its own first resolver call. Each
round starts a server (torch's default dual-stack listener, or an IPv4 loopback socket as
fork_store does), forks ``--children`` clients that connect either at once (as torch's agent
forks ranks that connect as soon as they run) or once every child is forked (fork_store's
``wait_for_sibling_forks``), and counts children still alive after ``--hang-s`` (killed then:
hung) and clients whose connect took over 1 s (a reverse lookup that went to a name server).
Figures only, no thresholds. Real torch, no harness code but the listener.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_round(children: int, ipv4: bool, wait_for_forks: bool, hang_s: float) -> tuple[int, int]:
    """(children hung, children slow to connect) in one round."""
    from torch.distributed import TCPStore

    from harness.launch.nodes import rendezvous_port
    from harness.rank.fork_store import LOOPBACK, ipv4_listener

    port = rendezvous_port()
    extra = {"master_listen_fd": ipv4_listener(port)} if ipv4 else {}
    server = TCPStore(LOOPBACK, port, children + 1, True, timedelta(seconds=60),
                      wait_for_workers=False, **extra)
    gate_r, gate_w = os.pipe()
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:  # the child: connect, say how long it took by the exit code, leave
            os.close(gate_w)
            if wait_for_forks:
                os.read(gate_r, 1)  # the parent closes its end once every child is forked
            began = time.monotonic()
            TCPStore(LOOPBACK, port, children + 1, False, timedelta(seconds=60)).add("n", 1)
            os._exit(3 if time.monotonic() - began > 1.0 else 0)
        pids.append(pid)
    os.close(gate_r)
    os.close(gate_w)
    hung = slow = 0
    deadline = time.monotonic() + hang_s
    for pid in pids:
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            hung += 1
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        elif os.waitstatus_to_exitcode(done[1]) == 3:
            slow += 1
    del server
    return hung, slow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--children", type=int, default=4)
    ap.add_argument("--hang-s", type=float, default=8.0,
                    help="a child still running this long after the round's forks is hung")
    args = ap.parse_args()
    print(f"{args.rounds} rounds x {args.children} children per way; pid {os.getpid()}")
    print(f"{'server listens on':<22} {'children connect':<22} {'hung':>6} {'slow (>1 s)':>12}")
    for ipv4 in (False, True):
        for wait in (False, True):
            hung = slow = 0
            for _ in range(args.rounds):
                h, s = one_round(args.children, ipv4, wait, args.hang_s)
                hung, slow = hung + h, slow + s
            total = args.rounds * args.children
            print(f"{'IPv4 loopback' if ipv4 else 'dual stack (torch)':<22} "
                  f"{'after every fork' if wait else 'at once':<22} "
                  f"{f'{hung}/{total}':>6} {f'{slow}/{total}':>12}", flush=True)


if __name__ == "__main__":
    main()
