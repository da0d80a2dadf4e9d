"""The fork-mode stage agent's store and its forked ranks' first step (harness/rank/fork_store.py):
a rank waits for every sibling's fork before it touches the network, and the agent's store
server listens on the IPv4 loopback, so no client's reverse lookup goes to a name server."""
from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import psutil
import pytest

from harness.launch.warm import WarmParents, parent_key
from harness.rank import fork_store

pytestmark = pytest.mark.cpu


def test_a_rank_waits_until_every_sibling_is_forked(tmp_path):
    def late_siblings():
        time.sleep(0.3)
        for r in (1, 2):
            (tmp_path / "forked" / "run" / f"rank{r}").touch()

    (tmp_path / "forked" / "run").mkdir(parents=True)
    t = threading.Thread(target=late_siblings)
    t.start()
    waited = fork_store.wait_for_sibling_forks(tmp_path, "run", 0, 3, wait_s=30)
    t.join()
    assert 0.25 <= waited < 10, waited
    assert sorted(os.listdir(tmp_path / "forked" / "run")) == ["rank0", "rank1", "rank2"]


def test_a_rank_whose_sibling_never_forks_names_it_after_the_bound(tmp_path):
    began = time.monotonic()
    with pytest.raises(fork_store.SiblingsNeverBegan, match=r"rank\(s\) \[0, 2\] of this stage"):
        fork_store.wait_for_sibling_forks(tmp_path, "run", 1, 3, wait_s=0.2)
    assert 0.2 <= time.monotonic() - began < 5


def test_the_store_server_listens_on_the_ipv4_loopback_only():
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from harness.launch.nodes import rendezvous_port

    port = rendezvous_port()
    params = RendezvousParameters(backend=fork_store.register(), endpoint=f"localhost:{port}",
                                  run_id="t", min_nodes=1, max_nodes=1, rank=0, timeout=30)
    info = get_rendezvous_handler(params).next_rendezvous()
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    listening = [c for c in psutil.Process().net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [(c.family, c.laddr.ip) for c in listening] == [(socket.AF_INET, "127.0.0.1")]
    info.store.set("k", "v")  # the rendezvous' store, under its run-id prefix
    assert TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=30)).get("t/k") == b"v"


@pytest.mark.slow  # fork mode runs in every cpu cell of tests/test_cells.py
def test_forked_ranks_meet_before_they_run(tmp_path):
    """A real fork-mode stage: each of its 4 ranks said it was forked, under the agent's run id."""
    parents = WarmParents()
    key = parent_key("cpu", "none", "local", tmp_path)
    try:
        r = parents.run(key, "save", tmp_path / "stage", 4, [], 90.0, {},
                        rank_module="tests.rank_programs.collectives", pg_timeout_s=6.0)
    finally:
        parents.close_all()
    assert r.ok, r.summary()
    (run_dir,) = (tmp_path / "stage" / "forked").iterdir()
    assert sorted(os.listdir(run_dir)) == [f"rank{k}" for k in range(4)]
