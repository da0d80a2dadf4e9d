"""The fork-mode stage agent's store, and the forked ranks' first step.

Why: torch's elastic agent hosts the stage's TCPStore server in a thread of its own process
(libuv, ``pt_tcpstore_uv``), and in fork mode that same process forks the ranks. The server
names every client it accepts (``LibUVStoreDaemon::onConnect`` -> ``formatSockAddr`` ->
``getnameinfo``), a glibc resolver call. Two faults follow, both seen with gdb on this repo's
cpu machine (2026-12-07, torch 2.13.0, glibc resolver, ``bench/fork_resolver.py``):

* A rank forked while that thread is inside the resolver inherits glibc's resolver lock held
  (``resolv_conf.c`` ``lock``; glibc does not reset it in a fork child) and hangs forever at its
  own first resolver call (every hung child caught: the TCPStore client's ``formatSockAddr``).
  Its peers then time out waiting for it (CI, 2026-12-07: ``DistStoreError wait timeout after
  60000ms, keys: /default_pg/0//cpu//0/3`` in a cell that passes on every other run: rank 3
  never published its gloo address; where it stopped was not recorded).
  ``wait_for_sibling_forks`` makes each forked rank wait until all of its stage's ranks are
  forked before it touches the network: no rank connects, so the server resolves nothing, while
  the agent forks.
* The server listens on IPv6 (dual stack), so a local client's address is IPv4-mapped
  (``::ffff:127.0.0.1``), which /etc/hosts does not list: the reverse lookup goes to DNS. In a
  forked agent here it often went unanswered, a 5 s stall of the whole store (a fresh torchrun's
  agent, same listener, did not stall: why is not established; docs/benchmarks.md).
  ``Ipv4StaticRendezvous`` is torch's static rendezvous with the server on an IPv4 socket of
  the loopback: a client is then ``127.0.0.1``, which /etc/hosts answers.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

BACKEND = "harness-static-ipv4"
LOOPBACK = "127.0.0.1"
LISTEN_BACKLOG = 2048
# A forked rank waits this long for its siblings' forks (a few milliseconds when every fork
# succeeds), then fails its stage naming those that never began; the stage environment's
# SIBLING_FORK_WAIT_ENV overrides it (tests).
SIBLING_FORK_WAIT_S = 20.0
SIBLING_FORK_WAIT_ENV = "HARNESS_FORK_SIBLING_WAIT_S"
SIBLING_POLL_S = 0.002


def register() -> str:
    """Make ``BACKEND`` a rendezvous backend of torch's elastic launcher (torch accepts the same
    creator twice); returns its name for ``LaunchConfig.rdzv_backend``."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)
    return BACKEND


def _create_handler(params):
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    static = create_rdzv_handler(params)  # torch's own parsing and checks of the endpoint
    return _handler_class()(LOOPBACK, static.master_port, static.rank, static.world_size,
                            static.run_id, int(static.timeout.total_seconds()))


def _handler_class():
    """torch's StaticTCPRendezvous with the store server on an IPv4 loopback socket (imported
    late: the controller never imports torch's elastic package)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    class Ipv4StaticRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return BACKEND  # torch checks a handler's backend against the name it asked for

        def next_rendezvous(self):
            if self._store is None and self.rank == 0:
                self._store = TCPStore(self.master_addr, self.master_port, self.world_size,
                                       True, self.timeout, multi_tenant=True,
                                       master_listen_fd=ipv4_listener(self.master_port))
            return super().next_rendezvous()

    return Ipv4StaticRendezvous


def ipv4_listener(port: int) -> int:
    """A listening IPv4 socket on the loopback at ``port``; its fd, for the store to own."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock.detach()


class SiblingsNeverBegan(RuntimeError):
    """Ranks of this stage that were forked (or were to be) and never took their first step."""


def wait_for_sibling_forks(stage_dir: Path, run_id: str, rank: int, local_world: int,
                           wait_s: float | None = None) -> float:
    """Say this rank is forked (``<stage_dir>/forked/<run_id>/rank<k>``, the agent's run id),
    then wait until every rank of the stage has said so: the agent forks them one after
    another, so once the last has said so no fork is left. Returns the seconds waited; raises
    ``SiblingsNeverBegan`` naming the ranks still silent after ``wait_s``: a child stuck before
    its first step (CI, 2026-12-07: on an import lock the agent's thread held at the fork) is
    then the stage's named cause, not a stage timeout with none."""
    if wait_s is None:
        from harness.switches import number

        wait_s = number(SIBLING_FORK_WAIT_ENV, default=SIBLING_FORK_WAIT_S)
    began = time.monotonic()
    forked = stage_dir / "forked" / run_id
    forked.mkdir(parents=True, exist_ok=True)
    (forked / f"rank{rank}").touch()
    deadline = began + wait_s
    while len(os.listdir(forked)) < local_world:
        if time.monotonic() >= deadline:
            began_ranks = {int(n[len("rank"):]) for n in os.listdir(forked)}
            missing = sorted(set(range(local_world)) - began_ranks)
            raise SiblingsNeverBegan(
                f"rank(s) {missing} of this stage never began after the stage agent forked them "
                f"(waited {wait_s:g} s): stuck in the forked child before their first step")
        time.sleep(SIBLING_POLL_S)
    return time.monotonic() - began
